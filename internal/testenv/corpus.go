package testenv

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"testing"

	"github.com/scorer/scorer/schema"
)

// ShortestTranscripts writes the n shortest real transcripts (whole, as they
// are in the corpus) to a JSONL file and returns it with their events. The
// shortest keep test time bounded on two cores without inventing data.
func ShortestTranscripts(t testing.TB, n int) (string, []schema.TranscriptEvent) {
	t.Helper()
	f, err := os.Open(Transcripts(t))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	type line struct {
		raw   []byte
		ev    schema.TranscriptEvent
		count int
	}
	var lines []line
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for sc.Scan() {
		ev, err := schema.DecodeEvent(sc.Bytes(), schema.DefaultLimits())
		if err != nil {
			t.Fatalf("corpus line %d: %v", len(lines)+1, err)
		}
		lines = append(lines, line{raw: bytes.Clone(sc.Bytes()), ev: ev, count: ev.SentenceCount()})
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	sort.SliceStable(lines, func(i, j int) bool { return lines[i].count < lines[j].count })
	path := filepath.Join(t.TempDir(), fmt.Sprintf("shortest-%d.jsonl", n))
	var buf bytes.Buffer
	var evs []schema.TranscriptEvent
	for _, l := range lines[:n] {
		buf.Write(l.raw)
		buf.WriteByte('\n')
		evs = append(evs, l.ev)
	}
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return path, evs
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
