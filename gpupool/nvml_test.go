package gpupool

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/prometheus/client_golang/prometheus"
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
	p := newPool(t, f, Mode(ModeAuto), Logger(zerolog.New(&logs)), withAfterCUDAInit(func() { cudaInit++ }))
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
	if len(warns) != 1 || !strings.Contains(warns[0], "no usable GPU, scoring on CPU") || !strings.Contains(warns[0], "no GPU") ||
		!strings.Contains(warns[0], `"problem":"no_driver"`) || !strings.Contains(warns[0], `"remedy":`) {
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

// TestUnavailableProbeIsLikeNoNVML: a pool handed the owner's failed NVML
// open (UnavailableProbe) answers as one that failed to open NVML itself,
// on any host: auto mode scores on the CPU after one warning naming the
// cause, cuda mode fails with the cause and its remedy.
func TestUnavailableProbeIsLikeNoNVML(t *testing.T) {
	nvmlErr := nvmlError("init", nvml.ERROR_LIBRARY_NOT_FOUND)
	var logs bytes.Buffer
	f := newFakeFactory(nil)
	p := newPool(t, f, Mode(ModeAuto), WithProbe(UnavailableProbe(nvmlErr)), Logger(zerolog.New(&logs)))
	if devs := p.Devices(); len(devs) != 1 || devs[0].Kind != CPU {
		t.Fatalf("auto: Devices() = %+v, want the CPU only", devs)
	}
	if n := strings.Count(logs.String(), `"level":"warn"`); n != 1 || !strings.Contains(logs.String(), `"problem":"no_driver"`) {
		t.Fatalf("auto: want one warning naming no_driver, got logs:\n%s", logs.String())
	}
	_, err := New(testCtx(t), newFakeFactory(nil).factory, Mode(ModeCUDA), WithProbe(UnavailableProbe(nvmlErr)))
	if !errors.Is(err, ErrNoGPU) || !strings.Contains(err.Error(), "mode cuda but no GPU works: no NVIDIA driver") {
		t.Fatalf("cuda: err = %v, want the mode-cuda error naming the missing driver", err)
	}
	if _, err := UnavailableProbe(nil).Devices(); !errors.Is(err, ErrNoGPU) {
		t.Errorf("UnavailableProbe(nil).Devices() = %v, want ErrNoGPU", err)
	}
}

func TestCUDAModeFailsWithoutGPU(t *testing.T) {
	requireNoNVML(t)
	f := newFakeFactory(nil)
	_, err := New(testCtx(t), f.factory, Mode(ModeCUDA))
	if !errors.Is(err, ErrNoGPU) || !strings.Contains(err.Error(), "mode cuda but no GPU works: no NVIDIA driver") ||
		!strings.Contains(err.Error(), "remedy: install an NVIDIA driver") {
		t.Fatalf("err = %v, want a clear mode-cuda/no-GPU error with cause and remedy", err)
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

// mockGPU is one device of a mocked NVML library (go-nvml's mock.Interface):
// the readings it returns and the failures it injects.
type mockGPU struct {
	uuid, name  string
	total, used uint64
	uuidRet     nvml.Return // DeviceGetUUID's answer (SUCCESS if zero)
	memV2Ret    nvml.Return // DeviceGetMemoryInfo_v2's answer
	memV1Ret    nvml.Return // DeviceGetMemoryInfo's answer
	procs       []nvml.ProcessInfo
	procsRet    nvml.Return
	v1Calls     int
	// migMode puts the GPU in MIG mode; migs are its instances by slot
	// (nil: a slot NVML refuses or that is empty).
	migMode bool
	migs    []*mockGPU
	pci     string // PCI bus id; default from the NVML index
	// util and utilRet are DeviceGetUtilizationRates' answer.
	util    uint32
	utilRet nvml.Return
}

// mockNVML builds a probe over a mocked NVML with gpus (in NVML order),
// memory v2 available when v2 is set, and env as the process environment.
func mockNVML(t *testing.T, v2 bool, env map[string]string, gpus ...*mockGPU) *nvmlProbe {
	t.Helper()
	handles := make([]*mock.Device, len(gpus))
	byHandle := map[nvml.Device]*mockGPU{}
	migHandles := map[*mockGPU]nvml.Device{}
	for i, g := range gpus {
		handles[i] = &mock.Device{}
		byHandle[handles[i]] = g
		for _, m := range g.migs {
			if m != nil {
				h := &mock.Device{}
				byHandle[h], migHandles[m] = m, h
			}
		}
	}
	lib := &mock.Interface{
		InitFunc:     func() nvml.Return { return nvml.SUCCESS },
		ShutdownFunc: func() nvml.Return { return nvml.SUCCESS },
		ExtensionsFunc: func() nvml.ExtendedInterface {
			return &mock.ExtendedInterface{LookupSymbolFunc: func(s string) error {
				if s == "nvmlDeviceGetMemoryInfo_v2" && !v2 {
					return errors.New("missing")
				}
				return nil
			}}
		},
		DeviceGetCountFunc: func() (int, nvml.Return) { return len(gpus), nvml.SUCCESS },
		DeviceGetHandleByIndexFunc: func(n int) (nvml.Device, nvml.Return) {
			if n < 0 || n >= len(handles) {
				return nil, nvml.ERROR_INVALID_ARGUMENT
			}
			return handles[n], nvml.SUCCESS
		},
		DeviceGetUUIDFunc: func(d nvml.Device) (string, nvml.Return) {
			g := byHandle[d]
			if g.uuidRet != nvml.SUCCESS {
				return "", g.uuidRet
			}
			return g.uuid, nvml.SUCCESS
		},
		DeviceGetNameFunc: func(d nvml.Device) (string, nvml.Return) { return byHandle[d].name, nvml.SUCCESS },
		DeviceGetMigModeFunc: func(d nvml.Device) (int, int, nvml.Return) {
			if byHandle[d].migMode {
				return nvml.DEVICE_MIG_ENABLE, nvml.DEVICE_MIG_ENABLE, nvml.SUCCESS
			}
			return nvml.DEVICE_MIG_DISABLE, nvml.DEVICE_MIG_DISABLE, nvml.SUCCESS
		},
		DeviceGetMaxMigDeviceCountFunc: func(nvml.Device) (int, nvml.Return) { return 7, nvml.SUCCESS },
		DeviceGetMigDeviceHandleByIndexFunc: func(d nvml.Device, k int) (nvml.Device, nvml.Return) {
			g := byHandle[d]
			if k >= len(g.migs) || g.migs[k] == nil {
				return nil, nvml.ERROR_NOT_FOUND
			}
			return migHandles[g.migs[k]], nvml.SUCCESS
		},
		DeviceGetPciInfoFunc: func(d nvml.Device) (nvml.PciInfo, nvml.Return) {
			var pci nvml.PciInfo
			id := byHandle[d].pci
			if id == "" {
				id = fmt.Sprintf("00000000:%02X:00.0", 0x17+slices.Index(handles, d.(*mock.Device)))
			}
			for i, c := range id {
				pci.BusId[i] = int8(c)
			}
			return pci, nvml.SUCCESS
		},
		DeviceGetMemoryInfo_v2Func: func(d nvml.Device) (nvml.Memory_v2, nvml.Return) {
			g := byHandle[d]
			if g.memV2Ret != nvml.SUCCESS {
				return nvml.Memory_v2{}, g.memV2Ret
			}
			return nvml.Memory_v2{Total: g.total, Used: g.used, Free: g.total - g.used}, nvml.SUCCESS
		},
		DeviceGetMemoryInfoFunc: func(d nvml.Device) (nvml.Memory, nvml.Return) {
			g := byHandle[d]
			g.v1Calls++
			if g.memV1Ret != nvml.SUCCESS {
				return nvml.Memory{}, g.memV1Ret
			}
			// v1 counts driver-reserved memory as used: 1 MiB more here,
			// so a test can tell which query answered.
			return nvml.Memory{Total: g.total, Used: g.used + 1<<20, Free: g.total - g.used - 1<<20}, nvml.SUCCESS
		},
		DeviceGetComputeRunningProcessesFunc: func(d nvml.Device) ([]nvml.ProcessInfo, nvml.Return) {
			g := byHandle[d]
			if g.procsRet != nvml.SUCCESS {
				return nil, g.procsRet
			}
			return g.procs, nvml.SUCCESS
		},
		DeviceGetUtilizationRatesFunc: func(d nvml.Device) (nvml.Utilization, nvml.Return) {
			g := byHandle[d]
			if g.utilRet != nvml.SUCCESS {
				return nvml.Utilization{}, g.utilRet
			}
			return nvml.Utilization{Gpu: g.util, Memory: g.util / 2}, nvml.SUCCESS
		},
		DeviceGetCurrentClocksEventReasonsFunc: func(nvml.Device) (uint64, nvml.Return) { return 0, nvml.SUCCESS },
	}
	lookup := func(k string) (string, bool) { v, ok := env[k]; return v, ok }
	probe, shutdown, err := newNVMLProbe(testCtx(t), lib, NVMLLookupEnv(lookup))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(shutdown)
	p := probe.(*nvmlProbe)
	p.pid = 4242
	return p
}

func gpuN(i int) *mockGPU {
	return &mockGPU{uuid: fmt.Sprintf("GPU-%d%d%d%d-aaaa", i, i, i, i), name: "NVIDIA H100", total: 80 << 30, used: uint64(i+1) << 30}
}

// One lost GPU, or one whose memory cannot be read, is left out with a
// warning; the others stay usable. With none usable it is ErrNoGPU, reasons
// included.
func TestNVMLDevicesSkipsBrokenGPUs(t *testing.T) {
	lost, noMem, oldDriver := gpuN(1), gpuN(3), gpuN(2)
	lost.uuidRet = nvml.ERROR_GPU_IS_LOST
	noMem.memV2Ret, noMem.memV1Ret = nvml.ERROR_NOT_SUPPORTED, nvml.ERROR_NOT_SUPPORTED
	oldDriver.memV2Ret = nvml.ERROR_FUNCTION_NOT_FOUND
	p := mockNVML(t, true, nil, gpuN(0), lost, oldDriver, noMem)
	devs, err := p.Devices()
	if err != nil {
		t.Fatal(err)
	}
	if len(devs) != 2 || devs[0].Index != 0 || devs[1].Index != 2 || devs[1].UUID != oldDriver.uuid || devs[1].TotalMemory != 80<<30 {
		t.Fatalf("Devices() = %+v, want GPUs 0 and 2", devs)
	}
	ws := p.DeviceWarnings()
	if len(ws) != 2 || !errors.Is(ws[0], ErrGPULost) || !strings.Contains(ws[0].Error(), "GPU 1") ||
		!errors.Is(ws[1], ErrNotSupported) || !strings.Contains(ws[1].Error(), "GPU 3") {
		t.Fatalf("DeviceWarnings() = %v, want GPU 1 lost and GPU 3 not supported", ws)
	}
	if _, _, _, err := p.MemoryInfo(1); err == nil {
		t.Error("MemoryInfo of the skipped GPU 1 succeeded")
	}

	t.Run("none usable", func(t *testing.T) {
		a, b := gpuN(0), gpuN(1)
		a.uuidRet, b.memV2Ret, b.memV1Ret = nvml.ERROR_GPU_IS_LOST, nvml.ERROR_GPU_IS_LOST, nvml.ERROR_GPU_IS_LOST
		p := mockNVML(t, true, nil, a, b)
		_, err := p.Devices()
		if !errors.Is(err, ErrNoGPU) || !errors.Is(err, ErrGPULost) || !strings.Contains(err.Error(), "GPU 1") {
			t.Fatalf("err = %v, want ErrNoGPU naming the lost GPUs", err)
		}
		if ws := p.DeviceWarnings(); len(ws) != 0 {
			t.Errorf("warnings after a failed Devices: %v", ws)
		}
	})

	t.Run("pool keeps the good GPUs", func(t *testing.T) {
		lost := gpuN(0)
		lost.uuidRet = nvml.ERROR_GPU_IS_LOST
		p := mockNVML(t, true, nil, lost, gpuN(1))
		pool := newPool(t, newFakeFactory(nil), gpuOpts(nil, WithProbe(p))...)
		if devs := pool.Devices(); len(devs) != 1 || devs[0].Kind != CUDA || devs[0].Index != 1 {
			t.Fatalf("pool devices %+v, want cuda:1 only", devs)
		}
	})
}

// v2 memory info falls back to v1 on any failure but a lost GPU.
func TestNVMLMemoryInfoFallsBackToV1(t *testing.T) {
	for _, tc := range []struct {
		name   string
		v2     bool
		ret    nvml.Return
		wantV1 bool
		want   error
	}{
		{"v2 answers", true, nvml.SUCCESS, false, nil},
		{"no v2 symbol", false, nvml.SUCCESS, true, nil},
		{"not supported", true, nvml.ERROR_NOT_SUPPORTED, true, nil},
		{"function not found", true, nvml.ERROR_FUNCTION_NOT_FOUND, true, nil},
		{"argument version mismatch", true, nvml.ERROR_ARGUMENT_VERSION_MISMATCH, true, nil},
		{"unknown", true, nvml.ERROR_UNKNOWN, true, nil},
		{"gpu lost", true, nvml.ERROR_GPU_IS_LOST, false, ErrGPULost},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := gpuN(0)
			p := mockNVML(t, tc.v2, nil, g)
			g.memV2Ret = tc.ret
			_, used, total, err := p.MemoryInfo(0)
			if tc.want != nil {
				if !errors.Is(err, tc.want) || g.v1Calls != 0 {
					t.Fatalf("err = %v after %d v1 calls, want %v and no v1 call", err, g.v1Calls, tc.want)
				}
				return
			}
			if err != nil || total != 80<<30 {
				t.Fatalf("MemoryInfo = %d/%d, %v", used, total, err)
			}
			if gotV1 := used == g.used+1<<20; gotV1 != tc.wantV1 || (g.v1Calls > 0) != tc.wantV1 {
				t.Errorf("used %d (v1 calls %d): v1 answered = %v, want %v", used, g.v1Calls, gotV1, tc.wantV1)
			}
		})
	}
}

func TestNVMLProcessMemory(t *testing.T) {
	const us = 4242 // mockNVML's pid
	for _, tc := range []struct {
		name  string
		procs []nvml.ProcessInfo
		ret   nvml.Return
		want  uint64
		err   error
	}{
		{"listed", []nvml.ProcessInfo{{Pid: 7, UsedGpuMemory: 1 << 30}, {Pid: us, UsedGpuMemory: 3 << 20}}, nvml.SUCCESS, 3 << 20, nil},
		{"one entry per MIG instance", []nvml.ProcessInfo{{Pid: us, UsedGpuMemory: 1 << 20}, {Pid: us, UsedGpuMemory: 2 << 20}}, nvml.SUCCESS, 3 << 20, nil},
		{"not listed (PID namespace)", []nvml.ProcessInfo{{Pid: 7, UsedGpuMemory: 1 << 30}}, nvml.SUCCESS, 0, ErrProcessNotListed},
		{"no processes", nil, nvml.SUCCESS, 0, ErrProcessNotListed},
		{"value not available", []nvml.ProcessInfo{{Pid: us, UsedGpuMemory: math.MaxUint64}}, nvml.SUCCESS, 0, ErrNotSupported},
		{"not supported", nil, nvml.ERROR_NOT_SUPPORTED, 0, ErrNotSupported},
		{"gpu lost", nil, nvml.ERROR_GPU_IS_LOST, 0, ErrGPULost},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := gpuN(0)
			g.procs, g.procsRet = tc.procs, tc.ret
			p := mockNVML(t, true, nil, g)
			got, err := p.ProcessMemory(0)
			if got != tc.want || !errors.Is(err, tc.err) || (tc.err == nil) != (err == nil) {
				t.Fatalf("ProcessMemory = %d, %v; want %d, %v", got, err, tc.want, tc.err)
			}
		})
	}
}

// scorer_gpu_busy_ratio through the real NVML adapter: each GPU's
// nvmlDeviceGetUtilizationRates (its Gpu field, not Memory) becomes that
// GPU's gauge, and a GPU whose driver answers NOT_SUPPORTED (as a MIG
// instance does) gets no series and no ratio instead of 0.
func TestNVMLBusyRatio(t *testing.T) {
	busy, noUtil := gpuN(0), gpuN(1)
	busy.util = 64
	noUtil.utilRet = nvml.ERROR_NOT_SUPPORTED
	p := mockNVML(t, true, nil, busy, noUtil)
	if _, err := p.Devices(); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	pool := newPool(t, newFakeFactory(nil), Mode(ModeCUDA), WithProbe(p), Registerer(reg), withBusyInterval(time.Millisecond),
		Calibrate(Calibration{Disabled: true, FallbackBase: 1, FallbackPerToken: 1}), withHeadroom(1))
	deadline := time.Now().Add(10 * time.Second)
	for {
		b := pool.Stats().GPUBusy
		if len(b) == 2 && b[0].Samples > 0 && b[1].Unsupported {
			if r, ok := b[0].Ratio(); !ok || r != 0.64 {
				t.Errorf("cuda:0 ratio %v (ok %v), want 0.64", r, ok)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("GPUBusy = %+v after 10 s", b)
		}
		time.Sleep(time.Millisecond)
	}
	if got, want := gathered(t, reg, "scorer_gpu_busy_ratio", "gpu"), map[string]float64{"cuda:0": 0.64}; !maps.Equal(got, want) {
		t.Errorf("scorer_gpu_busy_ratio = %v, want %v", got, want)
	}
}
