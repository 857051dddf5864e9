package bench

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/scorer/scorer/internal/fanout"
	"github.com/scorer/scorer/model"
	"github.com/scorer/scorer/schema"
)

// wholeProcInputs writes the typical and long inputs for one model folder
// into dir: typical is real transcript sentences (the first sentences of
// transcripts spread over the corpus's size distribution, up to sentences
// in all); long joins consecutive real sentences until each premise is
// about 480 tokens, so a pair with its hypothesis is ~490–500 tokens.
func wholeProcInputs(dir string, m *model.Model, corpus []corpusLine, sentences, longSentences int) (typical, long string, err error) {
	sample := spreadSample(corpus, 8)
	per := (sentences + len(sample) - 1) / len(sample)
	var lines [][]byte
	left := sentences
	for _, l := range sample {
		ev := l.ev
		var s []string
		for _, sec := range ev.SectionNames() {
			s = append(s, ev.Sections[sec]...)
		}
		s = s[:min(len(s), per, left)]
		left -= len(s)
		ev.Sections = map[string][]string{"FILT_MD": s}
		b, err := json.Marshal(ev)
		if err != nil {
			return "", "", err
		}
		lines = append(lines, b)
		if left == 0 {
			break
		}
	}
	typical = filepath.Join(dir, "typical.jsonl")
	if err := os.WriteFile(typical, append(bytes.Join(lines, []byte("\n")), '\n'), 0o644); err != nil {
		return "", "", err
	}

	var longs []string
	for _, l := range bySize(corpus) {
		if len(longs) == longSentences {
			break
		}
		var cur []string
		n := 0
		for _, sec := range l.ev.SectionNames() {
			for _, s := range l.ev.Sections[sec] {
				ids, err := m.Tokenizer.Encode(s)
				if err != nil {
					return "", "", err
				}
				cur, n = append(cur, s), n+len(ids)
				if n >= 480 {
					longs = append(longs, strings.Join(cur, " "))
					cur, n = nil, 0
					if len(longs) == longSentences {
						break
					}
				}
			}
			if len(longs) == longSentences {
				break
			}
		}
	}
	if len(longs) < longSentences {
		return "", "", fmt.Errorf("bench: the corpus gave %d long sentences, want %d", len(longs), longSentences)
	}
	b, err := json.Marshal(schema.TranscriptEvent{CallID: "BENCH-LONG", EntityID: "BENCH", Sections: map[string][]string{"FILT_MD": longs}})
	if err != nil {
		return "", "", err
	}
	long = filepath.Join(dir, "long.jsonl")
	return typical, long, os.WriteFile(long, append(b, '\n'), 0o644)
}

// inputStats is the pair count and pair lengths of an input file under m.
func inputStats(path string, m *model.Model, labels fanout.LabelConfig) (pairs int, mean float64, maxLen int, err error) {
	lines, err := loadCorpus(path, schema.DefaultLimits())
	if err != nil {
		return 0, 0, 0, err
	}
	var hyps [][]int32
	for _, h := range labels.Hypotheses() {
		ids, err := m.Tokenizer.Encode(h)
		if err != nil {
			return 0, 0, 0, err
		}
		hyps = append(hyps, ids)
	}
	total := 0
	for _, l := range lines {
		for _, sents := range l.ev.Sections {
			for _, s := range sents {
				ids, err := m.Tokenizer.Encode(s)
				if err != nil {
					return 0, 0, 0, err
				}
				for _, h := range hyps {
					n := m.Tokenizer.EncodePair(ids, h, m.MaxLength).Len()
					pairs, total, maxLen = pairs+1, total+n, max(maxLen, n)
				}
			}
		}
	}
	if pairs > 0 {
		mean = float64(total) / float64(pairs)
	}
	return pairs, mean, maxLen, nil
}
