package scoring

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/scorer/scorer/internal/config"
	"github.com/scorer/scorer/internal/testenv"
	"github.com/scorer/scorer/schema"
)

// logLines are the JSON log lines a stack wrote, by message.
func logLines(t *testing.T, b *bytes.Buffer) map[string]map[string]any {
	t.Helper()
	out := map[string]map[string]any{}
	sc := bufio.NewScanner(bytes.NewReader(b.Bytes()))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var l map[string]any
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			t.Fatalf("log line %q: %v", sc.Text(), err)
		}
		if msg, _ := l["message"].(string); msg != "" {
			out[msg] = l
		}
	}
	return out
}

// The graph cache of a scorer's own stack (one that loads its model: run,
// score) is written after the stack is open, so the first start waits for
// none of it, and with GRAPH_CACHE_WAIT before Close returns; the next
// stack's CPU session loads from it. Real ONNX Runtime and the tiny
// DeBERTa-v3.
func TestStackWritesGraphCacheAfterOpen(t *testing.T) {
	env := map[string]string{
		"MODEL_DIR":             testenv.ModelDir(t, "nli-deberta-v3-tiny"),
		"DEVICE":                "cpu",
		"CPU_CALIBRATION_CACHE": "off",
		"GRAPH_CACHE":           filepath.Join(t.TempDir(), "graph"),
		"GRAPH_CACHE_WAIT":      "true",
		"SCORE_CACHE_BYTES":     "0",
	}
	cfg, err := config.FromEnv(func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	rt, err := StartRuntime(testenv.ORTLib(t), zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close()
	open := func() (map[string]map[string]any, time.Time) {
		var buf bytes.Buffer
		// Each line's time in ns (zerolog's own stamp is in seconds);
		// the write logs from a goroutine of its own.
		log := zerolog.New(zerolog.SyncWriter(&buf)).Hook(zerolog.HookFunc(func(e *zerolog.Event, _ zerolog.Level, _ string) {
			e.Int64("ns", time.Now().UnixNano())
		}))
		s, err := Open(context.Background(), cfg, log, nil, OnRuntime(rt))
		if err != nil {
			t.Fatal(err)
		}
		opened := time.Now()
		if err := s.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
		return logLines(t, &buf), opened
	}
	first, opened := open()
	miss := first["CPU session created without the graph cache"]
	if miss == nil || miss["miss"] != "none kept" {
		t.Fatalf("first stack: no miss logged (%v)", miss)
	}
	entry, _ := miss["dir"].(string)
	written := first["graph cache written: the next start loads the optimised graph from it"]
	if written == nil || written["dir"] != entry {
		t.Fatalf("first stack: no write of %s logged before Close returned (%v)", entry, written)
	}
	ns, _ := first["model loaded"]["ns"].(float64)
	loaded := time.Unix(0, int64(ns))
	b, err := os.ReadFile(filepath.Join(entry, "manifest.json"))
	if err != nil {
		t.Fatal(err)
	}
	var man struct {
		Written time.Time `json:"written"`
	}
	if err := json.Unmarshal(b, &man); err != nil {
		t.Fatal(err)
	}
	if man.Written.Before(loaded) || man.Written.After(opened.Add(time.Minute)) {
		t.Errorf("entry written at %v; the model was loaded at %v and the stack open at %v: want it written after", man.Written, loaded, opened)
	}

	second, _ := open()
	if hit := second["CPU session loaded from the graph cache: ONNX Runtime's optimised graph and prepacked weights written at an earlier start"]; hit == nil || hit["dir"] != entry {
		t.Errorf("second stack did not load from %s: %v", entry, hit)
	}
	if second["graph cache written: the next start loads the optimised graph from it"] != nil {
		t.Error("second stack wrote the cache again")
	}
}

// A scorer's stack closed while its graph cache is still being written
// (ONNX Runtime's session creation cannot be interrupted) leaves the
// environment to the write, and a scorer started after it in the same
// process takes the environment over: before, Close left ONNX Runtime
// loaded and owned, and the next StartRuntime failed "already
// initialized" (so in-process tests ran with GRAPH_CACHE=off). The write
// ends on the taken-over environment without destroying it under the
// second scorer, which still scores, nor a third started after both.
// Real ONNX Runtime and the tiny DeBERTa-v3.
func TestStackClosedMidWriteLeavesRuntimeToTheNext(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "graph")
	env := map[string]string{
		"MODEL_DIR":             testenv.ModelDir(t, "nli-deberta-v3-tiny"),
		"DEVICE":                "cpu",
		"CPU_CALIBRATION_CACHE": "off",
		"GRAPH_CACHE":           dir,
		"SCORE_CACHE_BYTES":     "0",
	}
	cfg, err := config.FromEnv(func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	rt, err := StartRuntime(testenv.ORTLib(t), zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	var log testenv.LockedBuffer
	s, err := Open(ctx, cfg, zerolog.New(&log), nil, OnRuntime(rt))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if logSoFar(t, &log)["graph cache not written yet as the scorer stops: a process that exits now leaves it to the next start"] == nil {
		t.Fatal("the first stack's write ended before its Close: nothing left running to test")
	}
	if err := rt.Close(); err != nil {
		t.Fatal(err)
	}

	// Another library cannot be loaded beside the one the write holds.
	b, err := os.ReadFile(testenv.ORTLib(t))
	if err != nil {
		t.Fatal(err)
	}
	other := filepath.Join(t.TempDir(), filepath.Base(testenv.ORTLib(t)))
	if err := os.WriteFile(other, b, 0o755); err != nil {
		t.Fatal(err)
	}
	writeEnded := func() bool {
		l := logSoFar(t, &log)
		return l["graph cache not written; the next start optimises the graph again"] != nil || l["graph cache written: the next start loads the optimised graph from it"] != nil
	}
	switch rt, err := StartRuntime(other, zerolog.Nop()); {
	case err == nil:
		// Right only if the write let the environment go first; it logs
		// its end just after.
		time.Sleep(time.Second)
		if !writeEnded() {
			t.Fatal("a runtime from another library file started while the write held the first")
		}
		if err := rt.Close(); err != nil {
			t.Fatal(err)
		}
	case !strings.Contains(err.Error(), "still loaded for work its last owner left running"):
		t.Fatalf("a runtime from another library file while the write holds the first: %v, want it refused for that", err)
	}
	rt2, err := StartRuntime(testenv.ORTLib(t), zerolog.Nop())
	if err != nil {
		t.Fatalf("a second scorer in the process after the first ended mid-write: %v", err)
	}
	cfg.GraphCache = "off"
	s2, err := Open(ctx, cfg, zerolog.Nop(), nil, OnRuntime(rt2))
	if err != nil {
		t.Fatal(err)
	}
	// The first stack's write logs its end (stopped by the Close, once
	// its session was created) after it let the environment go.
	for deadline := time.Now().Add(2 * time.Minute); !writeEnded(); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the first stack's graph cache write did not end within 2 minutes")
		}
	}
	ev := schema.TranscriptEvent{CallID: "after-write", Sections: map[string][]string{"FILT_MD": {"Revenue grew in the quarter."}}}
	if _, err := s2.Scorer.Score(ctx, []schema.TranscriptEvent{ev}); err != nil {
		t.Fatalf("the second scorer after the first's write ended: %v", err)
	}
	if err := s2.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if err := rt2.Close(); err != nil {
		t.Fatal(err)
	}
	rt3, err := StartRuntime(testenv.ORTLib(t), zerolog.Nop())
	if err != nil {
		t.Fatalf("a third runtime once the others are done: %v", err)
	}
	if err := rt3.Close(); err != nil {
		t.Fatal(err)
	}
}

// logSoFar is logLines of what l holds so far.
func logSoFar(t *testing.T, l *testenv.LockedBuffer) map[string]map[string]any {
	return logLines(t, bytes.NewBuffer(l.Bytes()))
}
