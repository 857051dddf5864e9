package gpupool

import (
	"strings"
	"testing"
	"time"
)

// TestModeCUDAOpensNoCPUEngine: ModeCUDA (DEVICE=cuda) means GPUs only
// for the pool's life, not just at start. When no GPU can take a batch, a
// GPU that failed until it was degraded or one that can never hold the
// pair, the call fails as the GPU path says and no CPU engine is opened:
// such an engine would run without a memory budget, at the GPU's batch
// shape (16,384 tokens) and, with an fp16 graph, on the CPU's few fp16
// kernels. ModeAuto still falls back (TestRepeatedFailureDegradesToCPUFallback).
func TestModeCUDAOpensNoCPUEngine(t *testing.T) {
	for _, tc := range []struct {
		name   string
		engine *fakeEngine
		// perToken is the fallback memory estimate per token: large, no
		// pair fits the 1 GiB GPU.
		perToken uint64
	}{
		{name: "degraded", engine: &fakeEngine{err: errFakeCUDA}, perToken: 1},
		{name: "never fits", engine: &fakeEngine{}, perToken: 64 << 20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := newFakeFactory(map[string]*fakeEngine{"cuda:0": tc.engine})
			p := newPool(t, f, Mode(ModeCUDA), WithProbe(newFakeProbe(&fakeGPU{total: 1 << 30})),
				Calibrate(Calibration{Disabled: true, FallbackBase: 1, FallbackPerToken: tc.perToken}),
				withHeadroom(1), withAdmissionBackoff(time.Millisecond), withMaxDeviceFailures(2))
			_, err := p.ScorePairs(testCtx(t), makePairs(realisticLengths(20, 7)))
			if err == nil || !strings.Contains(err.Error(), "gpupool: no device can run") {
				t.Errorf("err = %v, want the GPU path's no-device error", err)
			}
			if e := f.engine("cpu"); e != nil {
				calls, _, _, _ := e.snapshot()
				t.Errorf("a CPU engine was opened under mode cuda and ran %d batches", calls)
			}
			if st := p.Stats(); st.Fallbacks != 0 || len(st.Devices) != 1 {
				t.Errorf("stats %+v: want no fallback and only cuda:0", st)
			}
		})
	}
}
