package gpupool

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/rs/zerolog"
)

// These tests use the real NVML adapter. On a machine with a GPU they are
// skipped: they pin down the no-GPU behaviour (this CI has no NVML library).
func requireNoNVML(t *testing.T) {
	t.Helper()
	probe, shutdown, err := NewNVMLProbe(testCtx(t))
	if err == nil {
		shutdown()
		if _, derr := probe.Devices(); derr == nil {
			t.Skip("this machine has a GPU; the no-GPU path is not testable here")
		}
	}
}

func TestNVMLProbeNoGPU(t *testing.T) {
	requireNoNVML(t)
	probe, shutdown, err := NewNVMLProbe(testCtx(t))
	if err == nil {
		defer shutdown()
		_, err = probe.Devices()
	}
	if !errors.Is(err, ErrNoGPU) {
		t.Fatalf("NewNVMLProbe/Devices err = %v, want ErrNoGPU", err)
	}
	if !strings.HasPrefix(err.Error(), "gpupool: ") {
		t.Errorf("error %q lacks the gpupool: prefix", err)
	}
	t.Logf("no GPU: %v", err)
}

func TestNVMLErrorClassification(t *testing.T) {
	cases := []struct {
		ret  nvml.Return
		want error
	}{
		{nvml.ERROR_LIBRARY_NOT_FOUND, ErrNoGPU},
		{nvml.ERROR_DRIVER_NOT_LOADED, ErrNoGPU},
		{nvml.ERROR_NOT_SUPPORTED, ErrNotSupported},
		{nvml.ERROR_FUNCTION_NOT_FOUND, ErrNotSupported},
		{nvml.ERROR_GPU_IS_LOST, ErrGPULost},
		{nvml.ERROR_RESET_REQUIRED, ErrGPULost},
	}
	for _, tc := range cases {
		err := nvmlError("op", tc.ret)
		if !errors.Is(err, tc.want) {
			t.Errorf("nvmlError(%d) = %v, want %v", int32(tc.ret), err, tc.want)
		}
	}
	if err := nvmlError("op", nvml.SUCCESS); err != nil {
		t.Errorf("SUCCESS = %v", err)
	}
	if err := nvmlError("op", nvml.ERROR_UNKNOWN); err == nil || errors.Is(err, ErrNoGPU) {
		t.Errorf("ERROR_UNKNOWN = %v, want a plain error", err)
	}
}

func TestAutoModeFallsBackToCPUWithOneWarning(t *testing.T) {
	requireNoNVML(t)
	var logs bytes.Buffer
	f := newFakeFactory(nil)
	cudaInit := 0
	p := newPool(t, f, Mode(ModeAuto), Logger(zerolog.New(&logs)), AfterCUDAInit(func() { cudaInit++ }))
	devs := p.Devices()
	if len(devs) != 1 || devs[0].Kind != CPU {
		t.Fatalf("Devices() = %+v, want the CPU only", devs)
	}
	var warns []string
	for _, line := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		if strings.Contains(line, `"level":"warn"`) {
			warns = append(warns, line)
		}
	}
	if len(warns) != 1 || !strings.Contains(warns[0], "no usable GPU, scoring on CPU") || !strings.Contains(warns[0], "no GPU") {
		t.Fatalf("want exactly one warning naming the reason, got logs:\n%s", logs.String())
	}
	if cudaInit != 0 {
		t.Error("AfterCUDAInit ran though no CUDA engine was attempted")
	}
	pairs := makePairs([]int{3, 9, 4})
	if scores, err := p.ScorePairs(testCtx(t), pairs); err != nil || checkScores(pairs, scores) != nil {
		t.Fatalf("CPU fallback pool: %v, %v", scores, err)
	}
}

func TestCUDAModeFailsWithoutGPU(t *testing.T) {
	requireNoNVML(t)
	f := newFakeFactory(nil)
	_, err := New(testCtx(t), f.factory, Mode(ModeCUDA))
	if !errors.Is(err, ErrNoGPU) || !strings.Contains(err.Error(), "mode cuda but no GPU works") {
		t.Fatalf("err = %v, want a clear mode-cuda/no-GPU error", err)
	}
	if len(f.made) != 0 {
		t.Errorf("factory opened %d engines; none should be opened", len(f.made))
	}
}

func TestCUDAModeFailsWhenEveryEngineFails(t *testing.T) {
	probe := newFakeProbe(&fakeGPU{total: 1 << 34})
	f := newFakeFactory(nil)
	f.failFor["cuda:0"] = errors.New("fake: libcudart.so not found")
	_, err := New(testCtx(t), f.factory, Mode(ModeCUDA), WithProbe(probe))
	if err == nil || !strings.Contains(err.Error(), "libcudart.so not found") {
		t.Fatalf("err = %v, want the engine's reason", err)
	}
}
