package offline

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/scorer/scorer/schema"
)

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

func (s *jsonlPartial) path() string { return s.o.f.Name() }

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
