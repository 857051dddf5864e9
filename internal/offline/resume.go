package offline

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/parquet-go/parquet-go"

	"github.com/scorer/scorer/internal/config"
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
}

func identityOf(m *model.Model, lc model.LabelConfig, cfg config.Config) (runIdentity, error) {
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

// jsonlPartial is --resume's JSONL store: <out>.partial, renamed to --out
// at the end.
type jsonlPartial struct {
	*jsonlSink
	o       *outputFile
	entries []doneTranscript
}

func openJSONLPartial(p, target string, id runIdentity) (*jsonlPartial, error) {
	f, err := os.OpenFile(p, os.O_RDWR|os.O_CREATE, 0o666)
	if err != nil {
		return nil, err
	}
	entries, keep, err := readJSONLPartial(f, id)
	if err == nil {
		err = f.Truncate(keep)
	}
	if err == nil {
		_, err = f.Seek(keep, io.SeekStart)
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("%s: %w", p, err)
	}
	s := &jsonlPartial{jsonlSink: newJSONLSink(f), entries: entries,
		o: &outputFile{f: f, target: target, keep: true, syncDir: fsyncDir}}
	s.durable = true
	return s, nil
}

// readJSONLPartial checks every complete line of f as a record of run id
// and returns them and the length of those lines, where appending resumes.
// A last line without its newline is a write cut short by a crash: it is
// cut off, to be scored again.
func readJSONLPartial(f *os.File, id runIdentity) (done []doneTranscript, keep int64, err error) {
	r := bufio.NewReaderSize(f, 1<<20)
	for n := 1; ; n++ {
		line, err := r.ReadBytes('\n')
		if errors.Is(err, io.EOF) {
			return done, keep, nil
		}
		if err != nil {
			return nil, 0, err
		}
		d, err := checkScored(line, id)
		if err != nil {
			return nil, 0, fmt.Errorf("line %d is not an output record of this run: %w; remove the file to start over", n, err)
		}
		done = append(done, d)
		keep += int64(len(line))
	}
}

// checkScored decodes one line strictly as a ScoredTranscript this run
// could have written: run id's model, question and encoding, every label
// in every section, one score in [0, 1] and a consistent flag per
// sentence, the flagged sentences counted in matches.
func checkScored(line []byte, id runIdentity) (doneTranscript, error) {
	dec := json.NewDecoder(bytes.NewReader(line))
	dec.DisallowUnknownFields()
	var st schema.ScoredTranscript
	if err := dec.Decode(&st); err != nil {
		return doneTranscript{}, err
	}
	if dec.More() {
		return doneTranscript{}, errors.New("more than one JSON value")
	}
	switch {
	case strings.TrimSpace(st.CallID) == "":
		return doneTranscript{}, errors.New("no call_id")
	case st.Model.Name != id.Model || st.Model.SHA256 != id.ModelSHA256:
		return doneTranscript{}, fmt.Errorf("model %s %s, this run's is %s %s", st.Model.Name, st.Model.SHA256, id.Model, id.ModelSHA256)
	case st.HypothesisTemplate != id.HypothesisTemplate || st.ScoreMode != id.ScoreMode || st.Threshold != id.Threshold ||
		st.PairEncoding != id.PairEncoding || st.PairSeparator != id.PairSeparator || !slices.Equal(st.Labels, id.Labels):
		return doneTranscript{}, fmt.Errorf("scored with template %q, score mode %q, pair encoding %q %q, labels %q, threshold %v; this run's are %q, %q, %q %q, %q, %v",
			st.HypothesisTemplate, st.ScoreMode, st.PairEncoding, st.PairSeparator, st.Labels, st.Threshold,
			id.HypothesisTemplate, id.ScoreMode, id.PairEncoding, id.PairSeparator, id.Labels, id.Threshold)
	case st.Source != nil:
		return doneTranscript{}, errors.New("has a Kafka source: not written by `scorer score`")
	case len(st.Sections) == 0:
		return doneTranscript{}, errors.New("no sections")
	}
	if _, err := time.Parse(time.RFC3339, st.ScoredAt); err != nil {
		return doneTranscript{}, fmt.Errorf("scored_at: %w", err)
	}
	for name, sec := range st.Sections {
		if sec.Sentences < 0 || len(sec.Results) != len(id.Labels) {
			return doneTranscript{}, fmt.Errorf("section %q: %d sentences, %d label results for %d labels", name, sec.Sentences, len(sec.Results), len(id.Labels))
		}
		for _, label := range id.Labels {
			lr, ok := sec.Results[label]
			if !ok {
				return doneTranscript{}, fmt.Errorf("section %q has no result for label %q", name, label)
			}
			if len(lr.Scores) != sec.Sentences || len(lr.Flags) != sec.Sentences {
				return doneTranscript{}, fmt.Errorf("section %q label %q: %d scores and %d flags for %d sentences", name, label, len(lr.Scores), len(lr.Flags), sec.Sentences)
			}
			flagged := 0
			for j, s := range lr.Scores {
				if err := checkScore(s, lr.Flags[j], id.Threshold); err != nil {
					return doneTranscript{}, fmt.Errorf("section %q label %q sentence %d: %w", name, label, j, err)
				}
				flagged += lr.Flags[j]
			}
			if len(lr.Matches) != flagged {
				return doneTranscript{}, fmt.Errorf("section %q label %q: %d matches for %d flags", name, label, len(lr.Matches), flagged)
			}
		}
	}
	return summarize(&st), nil
}

// checkScore: a probability, and the flag the threshold gives it.
func checkScore(s float32, flag int, threshold float64) error {
	if math.IsNaN(float64(s)) || s < 0 || s > 1 {
		return fmt.Errorf("score %v is not a probability", s)
	}
	want := 0
	if float64(s) > threshold {
		want = 1
	}
	if flag != want {
		return fmt.Errorf("flag %d for score %v at threshold %v", flag, s, threshold)
	}
	return nil
}

func (s *jsonlPartial) done() []doneTranscript { return s.entries }
func (s *jsonlPartial) path() string           { return s.o.f.Name() }

func (s *jsonlPartial) commit() error {
	if err := s.finish(); err != nil {
		return err
	}
	if err := s.o.commit(); err != nil {
		return err
	}
	return removePartial(s.o.f.Name())
}

func (s *jsonlPartial) keep() error {
	err := s.bw.Flush()
	if serr := s.f.Sync(); err == nil {
		err = serr
	}
	s.o.abort()
	return err
}

// Parquet --resume: <out>.partial/ holds part-NNNNNN.parquet files, each
// complete (footer, fsynced, renamed from .tmp, folder fsynced) with the
// transcripts it holds in its footer; a part is closed once it holds
// partRows rows or has been open partMaxAge, so an interrupted run loses at
// most that much work (a JSONL partial loses at most the chunks in
// flight). commit streams the parts' rows into --out in row groups.
const (
	partRows          = parquetRowGroupRows
	partMaxAge        = 30 * time.Second
	transcriptsKey    = "scorer.transcripts"
	partPrefix        = "part-"
	partTmpSuffix     = ".tmp"
	parquetCopyBuffer = 1024
)

type parquetPartial struct {
	dir, target string
	id          runIdentity
	entries     []doneTranscript
	parts       []string
	next        int
	cur         *partWriter
}

// partWriter is the part being written.
type partWriter struct {
	f           *os.File
	w           *parquetSink
	final       string
	opened      time.Time
	transcripts []doneTranscript
}

func openParquetPartial(dir, target string, id runIdentity) (*parquetPartial, error) {
	if err := os.Mkdir(dir, 0o777); err != nil && !errors.Is(err, fs.ErrExist) {
		return nil, err
	}
	if st, err := os.Stat(dir); err != nil || !st.IsDir() {
		return nil, fmt.Errorf("%s should be the folder of a Parquet --resume, and is not (%v); remove it to start over", dir, err)
	}
	s := &parquetPartial{dir: dir, target: target, id: id}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	for _, e := range ents {
		name := e.Name()
		switch {
		case strings.HasPrefix(name, partPrefix) && strings.HasSuffix(name, partTmpSuffix):
			// A part cut short by a crash: its transcripts are scored again.
			if err := os.Remove(filepath.Join(dir, name)); err != nil {
				return nil, err
			}
		case strings.HasPrefix(name, partPrefix) && strings.HasSuffix(name, ".parquet"):
			var n int
			if _, err := fmt.Sscanf(name, partPrefix+"%06d.parquet", &n); err != nil {
				return nil, fmt.Errorf("%s holds %s, which `scorer score` did not write; remove the folder to start over", dir, name)
			}
			// New parts are numbered after every kept one, so none is
			// ever replaced, even with a gap in the numbers.
			s.next = max(s.next, n+1)
			s.parts = append(s.parts, filepath.Join(dir, name))
		default:
			return nil, fmt.Errorf("%s holds %s, which `scorer score` did not write; remove the folder to start over", dir, name)
		}
	}
	slices.Sort(s.parts)
	for _, p := range s.parts {
		got, err := readPart(p, id)
		if err != nil {
			return nil, fmt.Errorf("%s is not a part this run could have written: %w; remove %s to start over", p, err, dir)
		}
		s.entries = append(s.entries, got...)
	}
	return s, nil
}

// readPart checks one part: its settings, and every row against the
// transcripts its footer lists (call, section, sentence and label in the
// order schema.Rows writes them; this run's model, encoding and threshold;
// a probability and its flag).
func readPart(path string, id runIdentity) ([]doneTranscript, error) {
	f, pf, err := openParquetFile(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var was runIdentity
	if v, ok := pf.Lookup(settingsKey); !ok || json.Unmarshal([]byte(v), &was) != nil {
		return nil, errors.New("no settings in its footer")
	} else if d := was.diff(id); len(d) > 0 {
		return nil, fmt.Errorf("scored with other settings: %s", strings.Join(d, "; "))
	}
	var done []doneTranscript
	if v, ok := pf.Lookup(transcriptsKey); !ok || json.Unmarshal([]byte(v), &done) != nil {
		return nil, errors.New("no list of transcripts in its footer")
	}
	if !parquet.EqualNodes(pf.Schema(), parquet.SchemaOf(parquetRow{})) {
		return nil, fmt.Errorf("its columns are not the output's: %v", pf.Schema())
	}
	if want := countRows(done, len(id.Labels)); pf.NumRows() != want {
		return nil, fmt.Errorf("%d rows, but its transcripts make %d", pf.NumRows(), want)
	}
	r := parquet.NewGenericReader[parquetRow](pf)
	defer r.Close()
	buf := make([]parquetRow, parquetCopyBuffer)
	var n, at int
	nextRow := func() (*parquetRow, error) {
		if at == n {
			var err error
			n, err = r.Read(buf)
			at = 0
			if n == 0 {
				return nil, fmt.Errorf("reading rows: %w", err)
			}
		}
		at++
		return &buf[at-1], nil
	}
	for _, d := range done {
		names := make([]string, 0, len(d.Sections))
		for name := range d.Sections {
			names = append(names, name)
		}
		slices.Sort(names)
		for _, name := range names {
			for i := range d.Sections[name] {
				for _, label := range id.Labels {
					row, err := nextRow()
					if err != nil {
						return nil, err
					}
					if row.CallID != d.CallID || row.Section != name || int(row.SentenceIndex) != i || row.Label != label {
						return nil, fmt.Errorf("row (%q, %q, %d, %q) where (%q, %q, %d, %q) belongs", row.CallID, row.Section, row.SentenceIndex, row.Label, d.CallID, name, i, label)
					}
					if row.ModelSHA256 != id.ModelSHA256 || row.PairEncoding != id.PairEncoding || row.Threshold != id.Threshold {
						return nil, fmt.Errorf("row (%q, %q, %d, %q): model %s, pair encoding %q, threshold %v", d.CallID, name, i, label, row.ModelSHA256, row.PairEncoding, row.Threshold)
					}
					if err := checkScore(row.Score, int(row.Flag), id.Threshold); err != nil {
						return nil, fmt.Errorf("row (%q, %q, %d, %q): %w", d.CallID, name, i, label, err)
					}
				}
			}
		}
	}
	return done, nil
}

func countRows(done []doneTranscript, labels int) int64 {
	var n int64
	for _, d := range done {
		for _, c := range d.Sections {
			n += int64(c * labels)
		}
	}
	return n
}

func (s *parquetPartial) done() []doneTranscript { return s.entries }
func (s *parquetPartial) path() string           { return s.dir }

func (s *parquetPartial) write(scored []schema.ScoredTranscript) error {
	if s.cur == nil {
		final := filepath.Join(s.dir, fmt.Sprintf("%s%06d.parquet", partPrefix, s.next))
		f, err := os.OpenFile(final+partTmpSuffix, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o666)
		if err != nil {
			return err
		}
		s.next++
		s.cur = &partWriter{f: f, w: newParquetSink(f, s.id.json()), final: final, opened: time.Now()}
	}
	if err := s.cur.w.write(scored); err != nil {
		return err
	}
	for i := range scored {
		s.cur.transcripts = append(s.cur.transcripts, summarize(&scored[i]))
	}
	return nil
}

func (s *parquetPartial) checkpoint() error {
	if s.cur != nil && (s.cur.w.rows >= partRows || time.Since(s.cur.opened) >= partMaxAge) {
		return s.closePart()
	}
	return nil
}

// closePart makes the current part complete and durable.
func (s *parquetPartial) closePart() error {
	c := s.cur
	if c == nil {
		return nil
	}
	s.cur = nil
	list, err := json.Marshal(c.transcripts)
	if err != nil {
		return err
	}
	c.w.w.SetKeyValueMetadata(transcriptsKey, string(list))
	err = c.w.finish()
	if serr := c.f.Sync(); err == nil {
		err = serr
	}
	if cerr := c.f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(c.f.Name(), c.final)
	}
	if err == nil {
		err = fsyncDir(s.dir)
	}
	if err != nil {
		os.Remove(c.f.Name())
		return fmt.Errorf("closing %s: %w", c.final, err)
	}
	s.parts = append(s.parts, c.final)
	s.entries = append(s.entries, c.transcripts...)
	return nil
}

func (s *parquetPartial) finish() error { return s.closePart() }

func (s *parquetPartial) keep() error { return s.closePart() }

// commit streams every part's rows into --out (row groups of
// parquetRowGroupRows, so memory stays flat), commits it and removes the
// partial output.
func (s *parquetPartial) commit() error {
	if err := s.closePart(); err != nil {
		return err
	}
	o, err := createOutput(s.target)
	if err != nil {
		return err
	}
	defer o.abort()
	w := newParquetWriter(o.f, s.id.json())
	buf := make([]parquetRow, parquetCopyBuffer)
	for _, p := range s.parts {
		if err := copyRows(w, p, buf); err != nil {
			return err
		}
	}
	if err := w.Close(); err != nil {
		return err
	}
	if err := o.commit(); err != nil {
		return err
	}
	return removePartial(s.dir)
}

func copyRows(w *parquet.GenericWriter[parquetRow], path string, buf []parquetRow) error {
	f, pf, err := openParquetFile(path)
	if err != nil {
		return err
	}
	defer f.Close()
	r := parquet.NewGenericReader[parquetRow](pf)
	defer r.Close()
	for {
		n, err := r.Read(buf)
		if n > 0 {
			if _, werr := w.Write(buf[:n]); werr != nil {
				return werr
			}
		}
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
	}
}
