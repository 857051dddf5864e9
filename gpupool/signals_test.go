//go:build cgo && unix

package gpupool

import (
	"bytes"
	"context"
	"os"
	"os/signal"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/rs/zerolog"

	"github.com/scorer/scorer/model"
)

// sigEngine replaces the SIGINT handler on its fifth run, as CUDA may on a
// run long after the first.
type sigEngine struct {
	fakeEngine
	runs atomic.Int32
}

func (e *sigEngine) ScorePairs(ctx context.Context, pairs []model.Pair) ([]float32, error) {
	if e.runs.Add(1) == 5 {
		signal.Ignore(os.Interrupt)
	}
	return e.fakeEngine.ScorePairs(ctx, pairs)
}

// The pool checks the guarded handlers after every GPU run, not only the
// first: a replacement on a later run is found and undone.
func TestPoolChecksSignalHandlersAfterEveryGPURun(t *testing.T) {
	defer signal.Reset(os.Interrupt)
	var logs bytes.Buffer
	probe := newFakeProbe(&fakeGPU{total: 80 << 30})
	eng := &sigEngine{}
	factory := func(d Device) (Engine, error) { return eng, nil }
	p, err := New(testCtx(t), factory, Mode(ModeCUDA), WithProbe(probe), Calibrate(Calibration{Disabled: true}),
		WorkersPerDevice(1), Logger(zerolog.New(&logs)))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close(context.Background())
	for range 8 {
		mustScore(t, p, makePairs([]int{5, 6}))
	}
	if !strings.Contains(logs.String(), "replaced shutdown signal handlers; restored them") {
		t.Fatalf("the replaced handler went unnoticed:\n%s", logs.String())
	}
	if n, _ := p.sigGuard.RestoreChanged(); n != 0 {
		t.Errorf("%d handlers still replaced after the pool's check", n)
	}
}
