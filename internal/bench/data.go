package bench

import (
	"encoding/json"
	"fmt"
	"os"
	"slices"

	"github.com/scorer/scorer/schema"
)

// corpusLine is one transcript of the benchmark corpus: the bytes that go on
// the wire and the decoded event (for pair counts and tokenizer timing).
type corpusLine struct {
	raw       []byte
	ev        schema.TranscriptEvent
	sentences int
}

// loadCorpus reads and decodes every line of a TranscriptEvent JSONL file.
// A line that does not decode is an error: the benchmark must measure the
// real corpus, not silently a subset of it.
func loadCorpus(path string, lim schema.Limits) ([]corpusLine, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("bench: transcripts: %w", err)
	}
	defer f.Close()
	var out []corpusLine
	err = schema.ReadEvents(f, lim, 64<<20, func(ev schema.TranscriptEvent, raw []byte) bool {
		out = append(out, corpusLine{raw: raw, ev: ev, sentences: ev.SentenceCount()})
		return true
	})
	if err != nil {
		return nil, fmt.Errorf("bench: %s %w", path, err)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("bench: %s holds no transcripts", path)
	}
	return out, nil
}

// bySize returns the corpus ordered by sentence count, shortest first
// (stable, so equal sizes keep file order and runs are reproducible).
func bySize(lines []corpusLine) []corpusLine {
	s := slices.Clone(lines)
	slices.SortStableFunc(s, func(a, b corpusLine) int { return a.sentences - b.sentences })
	return s
}

// spreadSample picks n transcripts at evenly spaced quantiles of the size
// distribution, so a small sample has the corpus's mix of short and long
// sentences and transcripts rather than only the first n in file order
// (which is alphabetical by ticker).
func spreadSample(lines []corpusLine, n int) []corpusLine {
	sorted := bySize(lines)
	if n >= len(sorted) {
		return sorted
	}
	out := make([]corpusLine, 0, n)
	for i := range n {
		out = append(out, sorted[(2*i+1)*len(sorted)/(2*n)])
	}
	return out
}

// shortest returns the n shortest transcripts: real records small enough
// that a low steady rate does not saturate two CPU cores.
func shortest(lines []corpusLine, n int) []corpusLine {
	sorted := bySize(lines)
	return sorted[:min(n, len(sorted))]
}

// withCallID returns the record with its call_id replaced, so the corpus can
// be repeated into a larger backlog without two records being the same call.
func withCallID(raw []byte, id string) ([]byte, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, err
	}
	v, err := json.Marshal(id)
	if err != nil {
		return nil, err
	}
	m["call_id"] = v
	return json.Marshal(m)
}

// repeatCorpus returns n records cycling through lines; after the first
// pass each copy gets a new call_id (<call_id>#r<k>).
func repeatCorpus(lines []corpusLine, n int) ([][]byte, error) {
	out := make([][]byte, 0, n)
	for i := 0; len(out) < n; i++ {
		l := lines[i%len(lines)]
		if k := i / len(lines); k > 0 {
			raw, err := withCallID(l.raw, fmt.Sprintf("%s#r%d", l.ev.CallID, k))
			if err != nil {
				return nil, err
			}
			out = append(out, raw)
			continue
		}
		out = append(out, l.raw)
	}
	return out, nil
}

// pairsOf is how many (sentence, label) pairs the lines make.
func pairsOf(lines []corpusLine, labels int) int {
	n := 0
	for _, l := range lines {
		n += l.sentences * labels
	}
	return n
}
