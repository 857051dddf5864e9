package bench

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/rs/zerolog"

	"github.com/scorer/scorer/internal/cli"
	"github.com/scorer/scorer/internal/config"
	"github.com/scorer/scorer/internal/scoring"
	"github.com/scorer/scorer/model"
	"github.com/scorer/scorer/schema"
)

// benchRun is one `scorer bench` run: what every section's run function
// reads (flags, settings, corpus, the parsed lists) and the report they
// write.
type benchRun struct {
	e         cli.Env
	rt        *scoring.Runtime
	cfg       config.Config
	bf        benchFlags
	log       zerolog.Logger
	mt        *meter
	corpus    []corpusLine
	dirs      []string
	skip      map[string]bool
	threads   []int // --scaling-threads
	workers   []int // --scaling-workers
	multiples []int // --memory-multiples
	rows      []int // --shape-rows
	tokens    []int // --shape-tokens
	plans     []cpuShape
	rep       *benchReport

	rawLoop, rawNote string // findRawLoop's answer, once asked (rawLooked)
	rawLooked        bool
}

// folder is one model folder an eachModel or eachPerf section runs on.
type folder struct {
	dir    string
	cfg    config.Config // the run's settings on this folder
	m      *model.Model
	name   string       // as the folder's rows name it
	sample []corpusLine // --transcripts-limit transcripts spread over sizes
	labels int
	prof   string // the pipeline's CPU profile ("" = none)

	mr *modelReport // eachModel sections write here
	pr *perfReport  // eachPerf sections write here

	// The --large-model stand-in (benchLarge) runs the shapes and int8
	// sections on its own, smaller sweep, timed as the large section.
	large        bool
	rows, tokens []int
}

// span is the name a section of f is timed under.
func (f *folder) span(section string) string {
	if f.large {
		return "large"
	}
	return section
}

// runAll runs the section table: each model folder's eachModel sections,
// then each folder's eachPerf sections, then the once sections, each in
// table order and less those --skip names.
func (b *benchRun) runAll(ctx context.Context) error {
	for _, d := range b.dirs {
		dir, err := config.ResolvePath(d)
		if err != nil {
			return fmt.Errorf("bench: model dir: %w", err)
		}
		f, err := b.modelFolder(dir)
		if err == nil && !b.skip["pipeline"] {
			err = b.runScope(ctx, eachModel, f)
		}
		if err != nil {
			return fmt.Errorf("bench: %s: %w", filepath.Base(dir), err)
		}
		b.rep.Models = append(b.rep.Models, *f.mr)
	}
	for _, d := range b.dirs {
		dir, err := config.ResolvePath(d)
		if err != nil {
			return fmt.Errorf("bench: model dir: %w", err)
		}
		f, err := b.perfFolder(dir, false, b.rows, b.tokens)
		if err == nil {
			err = b.runScope(ctx, eachPerf, f)
		}
		if err != nil {
			return fmt.Errorf("bench: %s: %w", filepath.Base(dir), err)
		}
		b.rep.Perf = append(b.rep.Perf, *f.pr)
	}
	return b.runScope(ctx, once, nil)
}

// runScope runs, in table order, the sections of scope not skipped.
func (b *benchRun) runScope(ctx context.Context, scope sectionScope, f *folder) error {
	for _, s := range sections {
		if s.scope == scope && !b.skip[s.name] {
			if err := s.run(ctx, b, f); err != nil {
				return err
			}
		}
	}
	return nil
}

// modelFolder loads dir for the eachModel sections.
func (b *benchRun) modelFolder(dir string) (*folder, error) {
	cfg := b.cfg
	cfg.ModelDir = dir
	m, err := scoring.LoadModel(cfg)
	if err != nil {
		return nil, err
	}
	f := &folder{dir: dir, cfg: cfg, m: m, name: m.Name, sample: spreadSample(b.corpus, b.bf.limit), labels: len(cfg.Labels),
		mr: &modelReport{Model: m.Name, SHA256: m.SHA256}}
	if b.bf.cpuProfile != "" {
		f.prof = b.bf.cpuProfile
		if len(b.dirs) > 1 {
			ext := filepath.Ext(f.prof)
			f.prof = strings.TrimSuffix(f.prof, ext) + "-" + m.Name + ext
		}
		f.mr.CPUProfile = f.prof
	}
	return f, nil
}

// perfFolder loads dir for the eachPerf sections (or, large, for the
// stand-in's), with the shape sweep's rows and tokens.
func (b *benchRun) perfFolder(dir string, large bool, rows, tokens []int) (*folder, error) {
	cfg := b.cfg
	cfg.ModelDir, cfg.ModelFile = dir, ""
	m, err := scoring.LoadModel(cfg)
	if err != nil {
		return nil, err
	}
	f := &folder{dir: dir, cfg: cfg, m: m, name: m.Name, sample: spreadSample(b.corpus, b.bf.limit), labels: len(cfg.Labels),
		large: large, rows: rows, tokens: tokens}
	if large {
		f.name += largeSuffix
	}
	f.pr = &perfReport{Model: f.name}
	return f, nil
}

// splitLines returns the records, their call_ids and decoded events.
func splitLines(lines []corpusLine) (recs [][]byte, keys []string, evs []schema.TranscriptEvent) {
	for _, l := range lines {
		recs = append(recs, l.raw)
		keys = append(keys, l.ev.CallID)
		evs = append(evs, l.ev)
	}
	return recs, keys, evs
}

// scalingEvents picks, from the sample sorted by size, the smallest event
// as a warm-up followed by events until at least pairs pairs.
func scalingEvents(sample []corpusLine, pairs, labels int) []schema.TranscriptEvent {
	sorted := bySize(sample)
	evs := []schema.TranscriptEvent{sorted[0].ev}
	n := 0
	for _, l := range sorted[1:] {
		if n >= pairs {
			break
		}
		evs = append(evs, l.ev)
		n += l.sentences * labels
	}
	if len(evs) == 1 { // a sample of one: time the warm-up event again
		evs = append(evs, sorted[0].ev)
	}
	return evs
}
