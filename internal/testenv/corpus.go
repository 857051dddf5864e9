package testenv

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"testing"

	"github.com/scorer/scorer/schema"
)

// corpus is the transcript corpus decoded once per test process. Decoding
// its 60 MB takes about 3 s of CPU, and 30 to 60 s under the race detector,
// and a package's tests ask for it many times (internal/offline did a dozen
// times, each decoding it again: most of that package's time).
type corpus struct {
	lines []corpusLine // in corpus order

	mu        sync.Mutex
	sentences map[[2]int][]string // CorpusSentences by bounds
}

type corpusLine struct {
	raw   []byte
	ev    schema.TranscriptEvent // shared: read, never handed out
	count int
}

// corpora are the decoded corpora, by path.
var corpora perPath[*corpus]

// loadCorpus is the corpus at Transcripts(t), decoded on first use.
func loadCorpus(t testing.TB) *corpus {
	t.Helper()
	return corpora.get(t, Transcripts(t), func(path string) (*corpus, error) {
		lines, err := readCorpus(path)
		return &corpus{lines: lines, sentences: map[[2]int][]string{}}, err
	})
}

// perPath is one value per corpus path per process, built on first use;
// a failed build fails every test that asks for it.
type perPath[T any] struct {
	mu sync.Mutex
	m  map[string]*onceValue[T]
}

type onceValue[T any] struct {
	once sync.Once
	v    T
	err  error
}

func (p *perPath[T]) get(t testing.TB, path string, build func(string) (T, error)) T {
	t.Helper()
	p.mu.Lock()
	if p.m == nil {
		p.m = map[string]*onceValue[T]{}
	}
	o := p.m[path]
	if o == nil {
		o = &onceValue[T]{}
		p.m[path] = o
	}
	p.mu.Unlock()
	o.once.Do(func() { o.v, o.err = build(path) })
	if o.err != nil {
		t.Fatal(o.err)
	}
	return o.v
}

func readCorpus(path string) ([]corpusLine, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var lines []corpusLine
	err = schema.ReadEvents(f, schema.DefaultLimits(), 64<<20, func(ev schema.TranscriptEvent, raw []byte) bool {
		lines = append(lines, corpusLine{raw: raw, ev: ev, count: ev.SentenceCount()})
		return true
	})
	if err != nil {
		return nil, fmt.Errorf("corpus %w", err)
	}
	return lines, nil
}

// ShortestTranscripts writes the n shortest real transcripts (whole, as they
// are in the corpus) to a JSONL file and returns it with their events. The
// shortest keep test time bounded on two cores without inventing data. The
// corpus is decoded once per process; the events returned are the caller's.
func ShortestTranscripts(t testing.TB, n int) (string, []schema.TranscriptEvent) {
	t.Helper()
	c := loadCorpus(t)
	order := make([]int, len(c.lines))
	for i := range order {
		order[i] = i
	}
	sort.SliceStable(order, func(i, j int) bool { return c.lines[order[i]].count < c.lines[order[j]].count })
	path := filepath.Join(t.TempDir(), fmt.Sprintf("shortest-%d.jsonl", n))
	var buf bytes.Buffer
	var evs []schema.TranscriptEvent
	for _, i := range order[:n] {
		raw := c.lines[i].raw
		ev, err := schema.DecodeEvent(raw, schema.DefaultLimits())
		if err != nil {
			t.Fatal(err)
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

// CorpusSentences is every distinct corpus sentence whose length is in
// [minLen, maxLen] bytes, in corpus order (sections by name within a
// transcript). The slice is shared by the process's callers: do not modify
// it.
func CorpusSentences(t testing.TB, minLen, maxLen int) []string {
	t.Helper()
	c := loadCorpus(t)
	c.mu.Lock()
	defer c.mu.Unlock()
	key := [2]int{minLen, maxLen}
	if out, ok := c.sentences[key]; ok {
		return out
	}
	seen := map[string]bool{}
	var out []string
	for _, l := range c.lines {
		names := make([]string, 0, len(l.ev.Sections))
		for name := range l.ev.Sections {
			names = append(names, name)
		}
		sort.Strings(names)
		for _, name := range names {
			for _, s := range l.ev.Sections[name] {
				if len(s) >= minLen && len(s) <= maxLen && !seen[s] {
					seen[s] = true
					out = append(out, s)
				}
			}
		}
	}
	c.sentences[key] = out
	return out
}

// ScorerEnv is the environment every in-test scorer gets (in-process or a
// built binary): the real model (ScorerModelDir) and ORT library, small
// batch waits so tests move quickly.
func ScorerEnv(t testing.TB) map[string]string {
	t.Helper()
	return map[string]string{
		"MODEL_DIR":        ScorerModelDir(t),
		"ORT_LIB":          ORTLib(t),
		"LOG_FORMAT":       "json",
		"BATCH_MAX_WAIT":   "50ms",
		"METRICS_ADDR":     "off",
		"SHUTDOWN_TIMEOUT": "20s",
		// A scorer writes ONNX Runtime's optimised graph after it is
		// ready, by default into the user's cache folder: tests keep
		// out of it, and their CPU for themselves. The graph cache's own
		// tests turn it on in a folder of their own.
		"GRAPH_CACHE": "off",
		// A killed member's partitions move after this; the default 30s
		// would make every crash drill mostly waiting.
		"KAFKA_SESSION_TIMEOUT": "10s",
	}
}

// ReadJSONL decodes every JSON value in the file at path (a JSONL input or
// a scorer's output), failing the test on a bad one.
func ReadJSONL[T any](t testing.TB, path string) []T {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []T
	dec := json.NewDecoder(bytes.NewReader(b))
	for {
		var v T
		if err := dec.Decode(&v); errors.Is(err, io.EOF) {
			return out
		} else if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		out = append(out, v)
	}
}

// Tail is the last n bytes of s (a process's log, an error text), marked
// when cut, so a failure message stays readable.
func Tail(s string, n int) string {
	if len(s) > n {
		return "…" + s[len(s)-n:]
	}
	return s
}
