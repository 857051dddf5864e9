package fanout

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"sync"
	"testing"

	ort "github.com/yalue/onnxruntime_go"

	"github.com/scorer/scorer/gpupool"
	"github.com/scorer/scorer/internal/testenv"
	"github.com/scorer/scorer/model"
	"github.com/scorer/scorer/model/ortenv"
	"github.com/scorer/scorer/schema"
)

// TestMain starts the process's one ONNX Runtime environment for the tests
// that score through a real session.
func TestMain(m *testing.M) {
	lib := os.Getenv("ORT_LIB")
	if lib == "" {
		lib = testenv.DefaultORTLib()
	}
	shutdown, err := ortenv.InitRuntime(lib)
	if err != nil {
		fmt.Fprintf(os.Stderr, "fanout tests need the ONNX Runtime library (run `make ort` or set ORT_LIB): %v\n", err)
		os.Exit(1)
	}
	code := m.Run()
	if err := shutdown(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		code = 1
	}
	os.Exit(code)
}

// models are the models loaded once per test process, one per set of
// LoadOptions: a DeBERTa Load takes about 0.7 s of CPU (3.6 s under the
// race detector), and many tests score with the same one. A *Model is
// read-only after Load, so tests share it.
var (
	modelsMu sync.Mutex
	models   = map[model.LoadOptions]*model.Model{}
)

// sharedLoad is the model Load(opts) returns, loaded on first use of these
// exact options. Options holding pointers (label indices) are not shared.
func sharedLoad(t testing.TB, opts model.LoadOptions) *model.Model {
	t.Helper()
	modelsMu.Lock()
	defer modelsMu.Unlock()
	if m, ok := models[opts]; ok {
		return m
	}
	m, err := model.Load(opts)
	if err != nil {
		t.Fatalf("Load(%s): %v", opts.Dir, err)
	}
	models[opts] = m
	return m
}

// newSession opens a session on m (two intra-op threads that do not spin
// between runs: the same scores, a quarter less CPU on a two-core machine)
// and closes it with the test.
func newSession(t testing.TB, m *model.Model) *model.Session {
	t.Helper()
	s, err := m.NewSession(model.SessionOptions{
		IntraOpThreads: 2, InterOpThreads: 1,
		Configure: func(o *ort.SessionOptions) error {
			return o.AddSessionConfigEntry("session.intra_op.allow_spinning", "0")
		},
		ConfigureKey: "session.intra_op.allow_spinning=0",
	})
	if err != nil {
		t.Fatalf("NewSession(%s): %v", m.Name, err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return s
}

// readTranscripts reads the first n events of the real corpus, keeping at
// most perSection sentences of each section so tests with a real model
// stay fast.
func readTranscripts(t *testing.T, n, perSection int) []schema.TranscriptEvent {
	t.Helper()
	f, err := os.Open(testenv.Transcripts(t))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 64<<20)
	var out []schema.TranscriptEvent
	for len(out) < n && sc.Scan() {
		var ev schema.TranscriptEvent
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			t.Fatal(err)
		}
		for k, v := range ev.Sections {
			if len(v) > perSection {
				ev.Sections[k] = v[:perSection]
			}
		}
		out = append(out, ev)
	}
	if err := sc.Err(); err != nil || len(out) < n {
		t.Fatalf("read %d of %d transcripts: %v", len(out), n, err)
	}
	return out
}

// The engines the fan-out drives: a session on one device, the pool across
// devices.
var (
	_ PairScorer = (*model.Session)(nil)
	_ PairScorer = (*gpupool.Pool)(nil)
)
