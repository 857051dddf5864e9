package fanout

import (
	"os"
	"sync"
	"testing"

	ort "github.com/yalue/onnxruntime_go"

	"github.com/scorer/scorer/gpupool"
	"github.com/scorer/scorer/internal/testenv"
	"github.com/scorer/scorer/model"
	"github.com/scorer/scorer/model/ortenv"
)

// TestMain starts the process's one ONNX Runtime environment for the tests
// that score through a real session.
func TestMain(m *testing.M) { os.Exit(testenv.MainWithORT(m, "fanout", ortenv.InitRuntime)) }

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

// The engines the fan-out drives: a session on one device, the pool across
// devices.
var (
	_ PairScorer = (*model.Session)(nil)
	_ PairScorer = (*gpupool.Pool)(nil)
)
