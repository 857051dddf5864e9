package model

import (
	"fmt"
	"os"
	"sync"
	"testing"

	"github.com/scorer/scorer/internal/testenv"
)

// TestMain creates the one ORT environment for the package's tests: ORT's
// environment is process-wide, so per-test setup would fight over it. The
// library path follows testenv.ORTLib, which needs a testing.TB and so cannot
// be called here.
func TestMain(m *testing.M) {
	lib := os.Getenv("ORT_LIB")
	if lib == "" {
		lib = testenv.DefaultORTLib()
	}
	shutdown, err := InitRuntime(lib)
	if err != nil {
		fmt.Fprintf(os.Stderr, "model tests need the ONNX Runtime library (run `make ort` or set ORT_LIB): %v\n", err)
		os.Exit(1)
	}
	code := m.Run()
	if err := shutdown(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		code = 1
	}
	if err := shutdown(); err != nil {
		fmt.Fprintln(os.Stderr, "second shutdown should be a no-op:", err)
		code = 1
	}
	os.Exit(code)
}

// loadModel loads a real model folder or fails the test.
func loadModel(t testing.TB, opts LoadOptions) *Model {
	t.Helper()
	m, err := Load(opts)
	if err != nil {
		t.Fatalf("Load(%s): %v", opts.Dir, err)
	}
	return m
}

// sharedModels are shared model folders loaded once per test process with
// default options (LoadOptions{Dir: dir}), for the tests that score with a
// model rather than test Load: a DeBERTa Load parses an 8.6 MB tokenizer
// and rewrites the graph, seconds of CPU under the race detector each time.
// The tests of Load itself (TestLoadRealModels, the options, errors,
// versions, external data) still load their own.
var (
	sharedMu     sync.Mutex
	sharedModels = map[string]*Model{}
)

// sharedModel is the model in dir with default options, loaded on first
// use. A *Model is read-only after Load and sessions on it are
// independent, so tests share it; they must not modify it.
func sharedModel(t testing.TB, dir string) *Model {
	t.Helper()
	sharedMu.Lock()
	defer sharedMu.Unlock()
	m, ok := sharedModels[dir]
	if !ok {
		m = loadModel(t, LoadOptions{Dir: dir})
		sharedModels[dir] = m
	}
	return m
}

// newSession opens a session on m and closes it with the test.
func newSession(t testing.TB, m *Model) *Session {
	t.Helper()
	s, err := m.NewSession(SessionOptions{IntraOpThreads: 2, InterOpThreads: 1})
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
