package scoring

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/scorer/scorer/internal/config"
	"github.com/scorer/scorer/internal/testenv"
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
