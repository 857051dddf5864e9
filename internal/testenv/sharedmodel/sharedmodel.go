// Package sharedmodel lets the tests of a command that builds its own
// scoring stack (`scorer score`, `scorer compare`) hand every run the model
// its settings name loaded once per test process, instead of loading the
// same folder again at every run: a DeBERTa-v3 Load parses an 8.6 MB
// tokenizer.json and rewrites the graph, about 4 s of CPU under the race
// detector, and those packages' tests run the command dozens of times.
//
// It is a separate package from testenv because it needs the model package,
// whose own tests import testenv.
package sharedmodel

import (
	"context"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/scorer/scorer/internal/config"
	"github.com/scorer/scorer/internal/scoring"
	"github.com/scorer/scorer/model"
)

// Open is scoring.Open on the model cfg names, loaded once per process per
// set of load options (config.Config.ModelOptions) and handed to the stack
// with scoring.WithModel: what a command's stack would load, since a Model
// is read-only after Load and holds no ORT session (each stack still opens
// its own sessions, pool and scorer). When the options or the model do not
// load, it is scoring.Open as the command calls it, so errors come from the
// production path; a failed load is not kept.
//
// A model is loaded again when a file of its folder (or its graph and data
// files) changed, appeared or went since it was loaded, so a test that
// rewrites a model in place never gets the old one.
func Open(ctx context.Context, cfg config.Config, log zerolog.Logger, reg prometheus.Registerer, opts ...scoring.Option) (*scoring.Stack, error) {
	m, ok := get(cfg)
	if !ok {
		return scoring.Open(ctx, cfg, log, reg, opts...)
	}
	return scoring.Open(ctx, cfg, log, reg, append(opts[:len(opts):len(opts)], scoring.WithModel(m))...)
}

// key is model.LoadOptions with its pointers read, so that equal options
// are equal keys.
type key struct {
	lo                  model.LoadOptions
	entailment, contrad int
}

type entry struct {
	m     *model.Model
	dir   string
	files map[string]stamp
}

type stamp struct {
	size int64
	mod  time.Time
}

var (
	mu     sync.Mutex
	models = map[key]entry{}
)

func get(cfg config.Config) (*model.Model, bool) {
	lo, err := cfg.ModelOptions()
	if err != nil {
		return nil, false
	}
	k := key{lo: lo, entailment: -1, contrad: -1}
	if lo.EntailmentIndex != nil {
		k.entailment = *lo.EntailmentIndex
	}
	if lo.ContradictionIndex != nil {
		k.contrad = *lo.ContradictionIndex
	}
	k.lo.EntailmentIndex, k.lo.ContradictionIndex = nil, nil
	mu.Lock()
	defer mu.Unlock()
	if e, ok := models[k]; ok && same(e.files, stamps(e.dir, e.m.Files())) {
		return e.m, true
	}
	m, err := model.Load(lo)
	if err != nil {
		delete(models, k)
		return nil, false
	}
	models[k] = entry{m: m, dir: lo.Dir, files: stamps(lo.Dir, m.Files())}
	return m, true
}

// stamps are the size and modification time of every file directly in dir
// (config, tokenizer, graph) and of files (the graph and its data files,
// which may lie in a subfolder).
func stamps(dir string, files []string) map[string]stamp {
	out := map[string]stamp{}
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if !e.IsDir() {
			files = append(files, filepath.Join(dir, e.Name()))
		}
	}
	for _, f := range files {
		if st, err := os.Stat(f); err == nil {
			out[f] = stamp{st.Size(), st.ModTime()}
		}
	}
	return out
}

func same(a, b map[string]stamp) bool {
	if len(a) != len(b) {
		return false
	}
	for f, s := range a {
		if t, ok := b[f]; !ok || t.size != s.size || !t.mod.Equal(s.mod) {
			return false
		}
	}
	return true
}
