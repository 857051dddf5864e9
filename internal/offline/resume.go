package offline

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"

	"github.com/scorer/scorer/internal/config"
	"github.com/scorer/scorer/internal/fanout"
	"github.com/scorer/scorer/model"
	"github.com/scorer/scorer/schema"
)

// --resume keeps completed transcripts beside --out: <out>.partial (the
// JSONL lines, or for Parquet a folder of part files) and
// <out>.partial.settings.json, what they were scored with. A later run
// continues only under the same settings and only from records it could
// have written itself; anything else is refused, naming the difference,
// and the files are left as they were.
const (
	partialSuffix  = ".partial"
	settingsSuffix = ".settings.json"
)

// runIdentity is every setting that decides a score or a flag, so two runs
// with equal identities write interchangeable records. The ONNX hash covers
// the weights; the tokenizer's hash and max length the ids; score mode and
// class indices how logits become a score; pair encoding and separator how
// a pair becomes input; template, labels and threshold the question and the
// flags. GPU_TF32 moves scores by more than 1e-4 on a GPU.
type runIdentity struct {
	Model              string   `json:"model"`
	ModelSHA256        string   `json:"model_sha256"`
	TokenizerSHA256    string   `json:"tokenizer_sha256"`
	MaxLength          int      `json:"max_length"`
	ScoreMode          string   `json:"score_mode"`
	EntailmentIndex    int      `json:"entailment_index"`
	ContradictionIndex int      `json:"contradiction_index"`
	PairEncoding       string   `json:"pair_encoding"`
	PairSeparator      string   `json:"pair_separator"`
	HypothesisTemplate string   `json:"hypothesis_template"`
	Labels             []string `json:"labels"`
	Threshold          float64  `json:"threshold"`
	GPUTF32            bool     `json:"gpu_tf32"`
	// OutputKey is what Parquet rows are keyed on, which decides the
	// versions they keep; JSONL output keeps every version and has none.
	OutputKey string `json:"output_key,omitempty"`
}

func identityOf(m *model.Model, lc fanout.LabelConfig, cfg config.Config) (runIdentity, error) {
	tok, err := os.ReadFile(filepath.Join(m.Dir, "tokenizer.json"))
	if err != nil {
		return runIdentity{}, fmt.Errorf("hashing the tokenizer: %w", err)
	}
	sum := sha256.Sum256(tok)
	return runIdentity{
		Model: m.Name, ModelSHA256: m.SHA256, TokenizerSHA256: hex.EncodeToString(sum[:]), MaxLength: m.MaxLength,
		ScoreMode: string(m.ScoreMode), EntailmentIndex: m.EntailmentIndex, ContradictionIndex: m.ContradictionIndex,
		PairEncoding: string(m.PairEncoding), PairSeparator: m.PairSeparator,
		HypothesisTemplate: lc.Template, Labels: slices.Clone(lc.Labels), Threshold: lc.Threshold, GPUTF32: cfg.GPUTF32,
	}, nil
}

func (id runIdentity) json() string {
	b, _ := json.Marshal(id)
	return string(b)
}

// diff names every setting that differs, as "name: was X, now Y".
func (id runIdentity) diff(now runIdentity) []string {
	var out []string
	a, b := reflect.ValueOf(id), reflect.ValueOf(now)
	for i := range a.NumField() {
		if !reflect.DeepEqual(a.Field(i).Interface(), b.Field(i).Interface()) {
			name, _, _ := strings.Cut(a.Type().Field(i).Tag.Get("json"), ",")
			out = append(out, fmt.Sprintf("%s: was %s, now %s", name, show(a.Field(i).Interface()), show(b.Field(i).Interface())))
		}
	}
	return out
}

// show is v as compact JSON, without HTML escapes ("</s></s>" stays so).
func show(v any) string {
	b, _ := schema.MarshalValue(v)
	return string(b)
}

// doneTranscript is a transcript the partial output already holds: its
// call_id and sentences per section, which the input must match.
type doneTranscript struct {
	CallID   string         `json:"call_id"`
	Sections map[string]int `json:"sections"`
}

// matches tells whether ev is the transcript that was scored.
func (d doneTranscript) matches(ev *schema.TranscriptEvent) bool {
	if ev.CallID != d.CallID || len(ev.Sections) != len(d.Sections) {
		return false
	}
	for name, sents := range ev.Sections {
		if n, ok := d.Sections[name]; !ok || n != len(sents) {
			return false
		}
	}
	return true
}

func summarize(st *schema.ScoredTranscript) doneTranscript {
	d := doneTranscript{CallID: st.CallID, Sections: make(map[string]int, len(st.Sections))}
	for name, sec := range st.Sections {
		d.Sections[name] = sec.Sentences
	}
	return d
}

// partialStore is --resume's output: what earlier runs completed (done),
// a sink that appends durably, commit (the whole output becomes --out,
// the partial files go) and keep (it stays, durable, for the next run).
type partialStore interface {
	sink
	done() []doneTranscript
	commit() error
	keep() error
	path() string
}

// openPartial opens or creates the partial output of --out for a run with
// identity id, checks the recorded settings against it and every record
// in it, and returns the store positioned to append.
func openPartial(out string, asParquet bool, id runIdentity) (partialStore, error) {
	target := out
	if st, err := os.Stat(out); err == nil {
		if !st.Mode().IsRegular() {
			return nil, fmt.Errorf("--resume needs a regular file --out, %s is not", out)
		}
		if t, err := filepath.EvalSymlinks(out); err == nil {
			target = t
		}
	}
	p := target + partialSuffix
	settings := p + settingsSuffix
	recorded, err := os.ReadFile(settings)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		recorded = nil
	case err != nil:
		return nil, err
	}
	if recorded != nil {
		var was runIdentity
		if err := json.Unmarshal(recorded, &was); err != nil {
			return nil, fmt.Errorf("%s is not a settings record (%v); remove it and %s to start over", settings, err, p)
		}
		if d := was.diff(id); len(d) > 0 {
			return nil, fmt.Errorf("%s was scored with other settings than this run: %s; run with the same settings, or remove %s and %s to start over",
				p, strings.Join(d, "; "), p, settings)
		}
	}
	var s partialStore
	if asParquet {
		s, err = openParquetPartial(p, target, id)
	} else {
		s, err = openJSONLPartial(p, target, id)
	}
	if err != nil {
		return nil, err
	}
	if recorded == nil {
		if n := len(s.done()); n > 0 {
			s.keep()
			return nil, fmt.Errorf("%s holds %d transcripts but no record of what they were scored with (%s is missing); remove it to start over", p, n, settings)
		}
		if err := writeAtomic(settings, []byte(id.json()+"\n")); err != nil {
			s.keep()
			return nil, err
		}
	}
	return s, nil
}

// writeAtomic writes data to path durably: a temporary file, fsynced,
// renamed over path, the folder fsynced.
func writeAtomic(path string, data []byte) error {
	f, err := createTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-")
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if serr := f.Sync(); err == nil {
		err = serr
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), path)
	}
	if err != nil {
		os.Remove(f.Name())
		return err
	}
	return fsyncDir(filepath.Dir(path))
}

// removePartial drops the partial output and its settings once --out is
// committed.
func removePartial(p string) error {
	err := os.RemoveAll(p)
	if rerr := os.Remove(p + settingsSuffix); err == nil && !errors.Is(rerr, fs.ErrNotExist) {
		err = rerr
	}
	return err
}
