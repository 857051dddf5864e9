package testenv

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"testing"

	"github.com/scorer/scorer/schema"
)

// ShortestTranscriptsLean is ShortestTranscripts without decoding the
// corpus: the same n transcripts (fewest sentences first, ties in corpus
// order), file and events. ShortestTranscripts decodes all 60 MB to count
// sentences, about 3 s of CPU and 30 s under the race detector, once per
// test process; this counts each line's sentences by scanning its JSON
// (sentenceCount) and decodes only the n it returns, which is what a
// package that needs no other corpus helper (CorpusSentences) should use.
//
// It checks the corpus less than ShortestTranscripts: a line is decoded,
// and so validated, only when it is returned (or when its shape is not the
// plain one the scan counts). Each returned transcript's decoded sentence
// count is checked against the scan's, so a scan that miscounted a line it
// returns fails the test.
func ShortestTranscriptsLean(t testing.TB, n int) (string, []schema.TranscriptEvent) {
	t.Helper()
	c := loadLean(t)
	order := make([]int, len(c.lines))
	for i := range order {
		order[i] = i
	}
	sort.SliceStable(order, func(i, j int) bool { return c.lines[order[i]].count < c.lines[order[j]].count })
	if n > len(order) {
		t.Fatalf("ShortestTranscriptsLean(%d): the corpus has %d transcripts", n, len(order))
	}
	path := filepath.Join(t.TempDir(), fmt.Sprintf("shortest-%d.jsonl", n))
	var buf bytes.Buffer
	var evs []schema.TranscriptEvent
	for _, i := range order[:n] {
		raw := c.lines[i].raw
		ev, err := schema.DecodeEvent(raw, schema.DefaultLimits())
		if err != nil {
			t.Fatalf("corpus line %d: %v", i+1, err)
		}
		if got := ev.SentenceCount(); got != c.lines[i].count {
			t.Fatalf("corpus line %d: the scan counted %d sentences, DecodeEvent %d", i+1, c.lines[i].count, got)
		}
		buf.Write(raw)
		buf.WriteByte('\n')
		evs = append(evs, ev)
	}
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return path, evs
}

// leanCorpus is the corpus's lines and their sentence counts, read once
// per process.
type leanCorpus struct {
	lines []leanLine
}

type leanLine struct {
	raw   []byte
	count int
}

var leanCorpora perPath[*leanCorpus]

func loadLean(t testing.TB) *leanCorpus {
	t.Helper()
	return leanCorpora.get(t, Transcripts(t), func(path string) (*leanCorpus, error) {
		lines, err := readLean(path)
		return &leanCorpus{lines: lines}, err
	})
}

// readLean splits the corpus into lines as readCorpus's bufio.Scanner does
// (a final line without a newline counts; a trailing \r is dropped) and
// counts each one's sentences.
func readLean(path string) ([]leanLine, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var lines []leanLine
	for len(data) > 0 {
		line := data
		if i := bytes.IndexByte(data, '\n'); i >= 0 {
			line, data = data[:i], data[i+1:]
		} else {
			data = nil
		}
		line = bytes.TrimSuffix(line, []byte{'\r'})
		count, ok := sentenceCount(line)
		if !ok {
			ev, err := schema.DecodeEvent(line, schema.DefaultLimits())
			if err != nil {
				return nil, fmt.Errorf("corpus line %d: %w", len(lines)+1, err)
			}
			count = ev.SentenceCount()
		}
		lines = append(lines, leanLine{raw: line, count: count})
	}
	return lines, nil
}

// sentenceCount is the number of sentences schema.DecodeEvent would find
// in line, counted without decoding it, when line has the plain shape of
// the corpus: one JSON object whose keys are among call_id, entity_id,
// company_name, call_name, event_time and version_id (each once, each a
// string, number, boolean or null) and "sections" (once), an object of
// distinct section names each holding an array of strings. For that shape
// DecodeEvent reads sections as decodeLower does, and the count is the
// arrays' elements. Anything else (an envelope, a change event, seed
// columns, a Python list literal, an escaped key, a non-string element)
// is not counted (ok false): the caller decodes that line. It does not
// validate what it skips (string contents, numbers); a line it counts is
// decoded only if returned.
func sentenceCount(line []byte) (count int, ok bool) {
	s := scan{b: line}
	if !s.byte('{') {
		return 0, false
	}
	seen := map[string]bool{}
	sections := false
	for first := true; ; first = false {
		if first && s.byte('}') {
			break
		}
		key, ok := s.plainString()
		if !ok || seen[key] || !s.byte(':') {
			return 0, false
		}
		seen[key] = true
		switch key {
		case "call_id", "entity_id", "company_name", "call_name", "event_time", "version_id":
			if !s.scalar() {
				return 0, false
			}
		case "sections":
			n, ok := s.sections()
			if !ok {
				return 0, false
			}
			count, sections = n, true
		default:
			return 0, false
		}
		if s.byte(',') {
			continue
		}
		if !s.byte('}') {
			return 0, false
		}
		break
	}
	s.ws()
	if s.i != len(s.b) || !sections {
		return 0, false
	}
	return count, true
}

// scan reads a JSON text forward from i.
type scan struct {
	b []byte
	i int
}

func (s *scan) ws() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

// byte skips whitespace and then c, reporting whether c was there.
func (s *scan) byte(c byte) bool {
	s.ws()
	if s.i < len(s.b) && s.b[s.i] == c {
		s.i++
		return true
	}
	return false
}

// str skips a string: a quote, then up to the first quote not escaped
// (preceded by an even number of backslashes). It returns the bytes
// between the quotes.
func (s *scan) str() ([]byte, bool) {
	s.ws()
	if s.i >= len(s.b) || s.b[s.i] != '"' {
		return nil, false
	}
	start := s.i + 1
	for j := start; ; {
		k := bytes.IndexByte(s.b[j:], '"')
		if k < 0 {
			return nil, false
		}
		q := j + k
		back := 0
		for p := q - 1; p >= start && s.b[p] == '\\'; p-- {
			back++
		}
		if back%2 == 0 {
			s.i = q + 1
			return s.b[start:q], true
		}
		j = q + 1
	}
}

// plainString is a string without escapes (a key whose text is its
// bytes).
func (s *scan) plainString() (string, bool) {
	raw, ok := s.str()
	if !ok || bytes.IndexByte(raw, '\\') >= 0 {
		return "", false
	}
	return string(raw), true
}

// scalar skips a string, number, true, false or null; an object or array
// is refused.
func (s *scan) scalar() bool {
	s.ws()
	if s.i >= len(s.b) {
		return false
	}
	switch c := s.b[s.i]; {
	case c == '"':
		_, ok := s.str()
		return ok
	case c == '{' || c == '[':
		return false
	}
	start := s.i
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ',', '}', ']', ' ', '\t', '\n', '\r':
			return s.i > start
		}
		s.i++
	}
	return false
}

// sections counts the strings of an object of distinct names to arrays of
// strings.
func (s *scan) sections() (int, bool) {
	if !s.byte('{') {
		return 0, false
	}
	names := map[string]bool{}
	count := 0
	for first := true; ; first = false {
		if first && s.byte('}') {
			return 0, true
		}
		name, ok := s.plainString()
		if !ok || names[name] || !s.byte(':') || !s.byte('[') {
			return 0, false
		}
		names[name] = true
		if !s.byte(']') {
			for {
				if _, ok := s.str(); !ok {
					return 0, false
				}
				count++
				if s.byte(',') {
					continue
				}
				if !s.byte(']') {
					return 0, false
				}
				break
			}
		}
		if s.byte(',') {
			continue
		}
		if !s.byte('}') {
			return 0, false
		}
		return count, true
	}
}
