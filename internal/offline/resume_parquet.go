package offline

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/parquet-go/parquet-go"

	"github.com/scorer/scorer/schema"
)

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

func (s *parquetPartial) path() string { return s.dir }

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
