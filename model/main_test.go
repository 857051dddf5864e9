package model

import (
	"os"
	"sync"
	"testing"

	ort "github.com/yalue/onnxruntime_go"

	"github.com/scorer/scorer/internal/testenv"
	"github.com/scorer/scorer/model/ortenv"
)

// TestMain runs the package's tests in the process's one ONNX Runtime
// environment.
func TestMain(m *testing.M) { os.Exit(testenv.MainWithORT(m, "model", ortenv.InitRuntime)) }

// loadModel loads a real model folder or fails the test.
func loadModel(t testing.TB, opts LoadOptions) *Model {
	t.Helper()
	m, err := Load(opts)
	if err != nil {
		t.Fatalf("Load(%s): %v", opts.Dir, err)
	}
	return m
}

// sharedModels are models loaded once per test process, one per set of
// LoadOptions, for the tests that score with a model or check what Load
// made of some options, rather than test Load's own steps: a DeBERTa Load
// parses an 8.6 MB tokenizer and rewrites the graph, about 0.7 s of CPU
// and 3.6 s under the race detector each time, and many tests ask for the
// same options (the rewrite's tests: the same folder kept and rewritten,
// in both encodings). Load is deterministic in its options and folder, so
// a test sharing a model checks what its own Load would have given. The
// tests of Load's steps (options that fail, Start and Wait, versions of
// folders made for the test, external data) still load their own.
var (
	sharedMu     sync.Mutex
	sharedModels = map[LoadOptions]*Model{}
)

// sharedModel is the model in dir with default options, loaded on first
// use. A *Model is read-only after Load and sessions on it are
// independent, so tests share it; they must not modify it.
func sharedModel(t testing.TB, dir string) *Model {
	t.Helper()
	return sharedLoad(t, LoadOptions{Dir: dir})
}

// sharedLoad is the model Load(opts) returns, loaded on first use of these
// exact options (as sharedModel). Options holding pointers (the label
// indices) would be keyed by address, so they are refused: such tests load
// their own.
func sharedLoad(t testing.TB, opts LoadOptions) *Model {
	t.Helper()
	if opts.EntailmentIndex != nil || opts.ContradictionIndex != nil {
		t.Fatalf("sharedLoad(%+v): label indices are pointers; load the model with loadModel", opts)
	}
	sharedMu.Lock()
	defer sharedMu.Unlock()
	m, ok := sharedModels[opts]
	if !ok {
		m = loadModel(t, opts)
		sharedModels[opts] = m
	}
	return m
}

// noSpinning turns off the spinning of ORT's intra-op threads: by default
// they busy-wait after every Run for the next one, which on the two-core
// test machine is a quarter of the CPU of a test that scores batch after
// batch (TestGoldenScores, TestScoreCacheReal), and the same logits.
// The production sessions' options, spinning included, are what
// TestMemoryKey, TestNewSessionOptions and the sessions tests make with
// NewSession directly.
var noSpinning = SessionOptions{
	Configure: func(o *ort.SessionOptions) error {
		return o.AddSessionConfigEntry("session.intra_op.allow_spinning", "0")
	},
	ConfigureKey: "session.intra_op.allow_spinning=0",
}

// newSession opens a session on m (two intra-op threads, not spinning)
// and closes it with the test.
func newSession(t testing.TB, m *Model) *Session {
	t.Helper()
	opts := noSpinning
	opts.IntraOpThreads, opts.InterOpThreads = 2, 1
	return openSession(t, m, opts)
}

// openSession opens a session on m with opts and closes it with the test.
func openSession(t testing.TB, m *Model, opts SessionOptions) *Session {
	t.Helper()
	s, err := m.NewSession(opts)
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
