package gpupool

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/rs/zerolog"

	"github.com/scorer/scorer/model/ortenv"
)

// CUDA_VISIBLE_DEVICES: which NVML GPUs CUDA sees, in which order (the
// position is the CUDA device_id), and what cannot be mapped.
func TestVisibleGPUs(t *testing.T) {
	all := []nvmlGPU{
		{index: 0, uuid: "GPU-8932f937-d72c-4106-c12f-20bd9faed9f6", name: "A"},
		{index: 1, uuid: "GPU-1111aaaa-0000-0000-0000-000000000000", name: "A"},
		{index: 2, uuid: "GPU-1111bbbb-0000-0000-0000-000000000000", name: "A"},
		{index: 3, uuid: "GPU-3333cccc-0000-0000-0000-000000000000", name: "A"},
	}
	unset := map[string]string{}
	for _, tc := range []struct {
		name     string
		env      map[string]string
		gpus     []nvmlGPU
		want     []int // NVML indexes in CUDA order
		warnings int
		err      string
	}{
		{name: "unset: all in NVML order", env: unset, want: []int{0, 1, 2, 3}},
		{name: "indexes reorder", env: map[string]string{"CUDA_VISIBLE_DEVICES": "2,1"}, want: []int{2, 1}},
		{name: "spaces", env: map[string]string{"CUDA_VISIBLE_DEVICES": " 3 , 0 "}, want: []int{3, 0}},
		{name: "full UUID", env: map[string]string{"CUDA_VISIBLE_DEVICES": "GPU-3333cccc-0000-0000-0000-000000000000"}, want: []int{3}},
		{name: "UUID prefixes, any case", env: map[string]string{"CUDA_VISIBLE_DEVICES": "gpu-8932F937,GPU-1111b"}, want: []int{0, 2}},
		{name: "mixed index and UUID", env: map[string]string{"CUDA_VISIBLE_DEVICES": "GPU-3333,1"}, want: []int{3, 1}},
		{name: "-1 ends the list", env: map[string]string{"CUDA_VISIBLE_DEVICES": "0,2,-1,1"}, want: []int{0, 2}, warnings: 1},
		{name: "index past the last GPU ends the list", env: map[string]string{"CUDA_VISIBLE_DEVICES": "1,9,0"}, want: []int{1}, warnings: 1},
		{name: "unknown UUID ends the list", env: map[string]string{"CUDA_VISIBLE_DEVICES": "3,GPU-ffff"}, want: []int{3}, warnings: 1},
		{name: "repeat ends the list", env: map[string]string{"CUDA_VISIBLE_DEVICES": "1,1,2"}, want: []int{1}, warnings: 1},
		{name: "trailing comma", env: map[string]string{"CUDA_VISIBLE_DEVICES": "1,"}, want: []int{1}},
		{name: "empty hides every GPU", env: map[string]string{"CUDA_VISIBLE_DEVICES": ""}, err: "makes no GPU visible"},
		{name: "-1 hides every GPU", env: map[string]string{"CUDA_VISIBLE_DEVICES": "-1"}, err: "makes no GPU visible"},
		{name: "MIG device", env: map[string]string{"CUDA_VISIBLE_DEVICES": "MIG-5a8c9c8e-0a37-5f55-9c1e-5a0c3d0e2f11"}, err: "MIG instance"},
		{name: "old MIG form", env: map[string]string{"CUDA_VISIBLE_DEVICES": "0,MIG-GPU-8932f937/1/0"}, err: "MIG instance"},
		{name: "ambiguous UUID prefix", env: map[string]string{"CUDA_VISIBLE_DEVICES": "GPU-1111"}, err: "more than one GPU"},
		{name: "UUID and a GPU whose UUID is unreadable", env: map[string]string{"CUDA_VISIBLE_DEVICES": "GPU-ffff"},
			gpus: []nvmlGPU{{index: 0, uuid: "GPU-aaaa"}, {index: 1, err: ErrGPULost}}, err: "UUID NVML can read"},
		{name: "index of an unreadable GPU maps (Devices skips it)", env: map[string]string{"CUDA_VISIBLE_DEVICES": "1,0"},
			gpus: []nvmlGPU{{index: 0, uuid: "GPU-aaaa"}, {index: 1, err: ErrGPULost}}, want: []int{1, 0}},
		{name: "mixed models without PCI_BUS_ID order", env: unset,
			gpus: []nvmlGPU{{index: 0, name: "A"}, {index: 1, name: "B"}}, want: []int{0, 1}, warnings: 1},
		{name: "mixed models with PCI_BUS_ID order", env: map[string]string{"CUDA_DEVICE_ORDER": "PCI_BUS_ID"},
			gpus: []nvmlGPU{{index: 0, name: "A"}, {index: 1, name: "B"}}, want: []int{0, 1}},
		{name: "mixed models named by UUID", env: map[string]string{"CUDA_VISIBLE_DEVICES": "GPU-b,GPU-a"},
			gpus: []nvmlGPU{{index: 0, name: "A", uuid: "GPU-a"}, {index: 1, name: "B", uuid: "GPU-b"}}, want: []int{1, 0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			gpus := tc.gpus
			if gpus == nil {
				gpus = all
			}
			lookup := func(k string) (string, bool) { v, ok := tc.env[k]; return v, ok }
			got, warnings, err := visibleGPUs(gpus, lookup)
			if tc.err != "" {
				if !errors.Is(err, ErrNoGPU) || !strings.Contains(err.Error(), tc.err) || !strings.Contains(err.Error(), "CUDA_VISIBLE_DEVICES") {
					t.Fatalf("err = %v, want ErrNoGPU saying %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var idx []int
			for _, g := range got {
				idx = append(idx, g.index)
			}
			if !slices.Equal(idx, tc.want) || len(warnings) != tc.warnings {
				t.Fatalf("visible %v, warnings %v; want %v and %d warnings", idx, warnings, tc.want, tc.warnings)
			}
		})
	}
}

// Under CUDA_VISIBLE_DEVICES the pool's device index is the CUDA ordinal
// (the CUDA provider's device_id), and admission reads that GPU's memory,
// not the one NVML numbers the same. A MIG device fails cuda mode clearly
// and sends auto mode to the CPU with the reason.
func TestPoolMapsCUDAVisibleDevices(t *testing.T) {
	g0, g1, g2 := gpuN(0), gpuN(1), gpuN(2)
	p := mockNVML(t, true, map[string]string{"CUDA_VISIBLE_DEVICES": "2,0"}, g0, g1, g2)
	f := newFakeFactory(nil)
	pool := newPool(t, f, gpuOpts(nil, WithProbe(p))...)
	devs := pool.Devices()
	if len(devs) != 2 || devs[0].Index != 0 || devs[0].UUID != g2.uuid || devs[1].Index != 1 || devs[1].UUID != g0.uuid {
		t.Fatalf("Devices() = %+v, want cuda:0 = NVML 2 and cuda:1 = NVML 0", devs)
	}
	if id := cudaProviderOptions(devs[0], SessionConfig{})["device_id"]; id != "0" {
		t.Errorf("device_id for NVML GPU 2 = %s, want CUDA ordinal 0", id)
	}
	if _, used, _, err := p.MemoryInfo(0); err != nil || used != g2.used {
		t.Errorf("MemoryInfo(cuda:0) used = %d, %v; want NVML GPU 2's %d", used, err, g2.used)
	}
	mustScore(t, pool, makePairs([]int{4, 8, 16}))

	mig := map[string]string{"CUDA_VISIBLE_DEVICES": "MIG-5a8c9c8e-0a37-5f55-9c1e-5a0c3d0e2f11"}
	_, err := New(testCtx(t), f.factory, gpuOpts(nil, WithProbe(mockNVML(t, true, mig, gpuN(0))))...)
	if err == nil || !strings.Contains(err.Error(), "mode cuda but no GPU works") || !strings.Contains(err.Error(), "MIG instance") {
		t.Fatalf("cuda mode with a MIG device: err = %v, want a clear error", err)
	}
	var logs bytes.Buffer
	auto := newPool(t, newFakeFactory(nil), Mode(ModeAuto), WithProbe(mockNVML(t, true, mig, gpuN(0))), Logger(zerolog.New(&logs)))
	if devs := auto.Devices(); len(devs) != 1 || devs[0].Kind != CPU {
		t.Fatalf("auto mode with a MIG device: %+v, want the CPU", devs)
	}
	if !strings.Contains(logs.String(), "no usable GPU, scoring on CPU") || !strings.Contains(logs.String(), "MIG instance") {
		t.Errorf("auto mode's warning lacks the MIG reason:\n%s", logs.String())
	}
}

// MIG: in a container given one MIG instance, NVML lists the parent GPU
// (whose memory query answers NO_PERMISSION) in MIG mode; the pool uses the
// instance's handle for memory, its UUID, and CUDA ordinal 0, and maps a
// MIG UUID in CUDA_VISIBLE_DEVICES to it. With no readable instance the
// cause is MIG permission. CUDA uses one instance per process.
func TestNVMLMIG(t *testing.T) {
	inst := func(n int) *mockGPU {
		return &mockGPU{uuid: fmt.Sprintf("MIG-%d5a8c9c8-0a37-5f55-9c1e-5a0c3d0e2f11", n), name: "ignored", total: 10 << 30, used: 1 << 30}
	}
	parent := func(migs ...*mockGPU) *mockGPU {
		g := gpuN(0)
		g.migMode, g.migs = true, migs
		g.memV2Ret, g.memV1Ret = nvml.ERROR_NO_PERMISSION, nvml.ERROR_NO_PERMISSION
		return g
	}
	one := inst(1)
	// Without CUDA_VISIBLE_DEVICES=MIG-<uuid>, which instance CUDA takes is
	// its own choice: refused, naming the instance to set.
	for _, env := range []map[string]string{{}, {"CUDA_VISIBLE_DEVICES": "0"}} {
		_, err := mockNVML(t, true, env, parent(nil, nil, one)).Devices()
		pr, ok := ortenv.DiagnoseCUDA(err)
		if !errors.Is(err, ErrMIGNeedsUUID) || !errors.Is(err, ErrNoGPU) || !ok || pr.Kind != ortenv.ProblemMIGNeedsUUID || !strings.Contains(err.Error(), one.uuid) {
			t.Errorf("env %v: %v (diagnosis %+v), want mig_needs_uuid naming %s", env, err, pr, one.uuid)
		}
	}
	for _, env := range []map[string]string{{"CUDA_VISIBLE_DEVICES": one.uuid}, {"CUDA_VISIBLE_DEVICES": one.uuid[:12]}} {
		p := mockNVML(t, true, env, parent(nil, nil, one))
		devs, err := p.Devices()
		if err != nil {
			t.Fatalf("env %v: %v", env, err)
		}
		if len(devs) != 1 || !devs[0].MIG || devs[0].UUID != one.uuid || devs[0].Index != 0 || devs[0].TotalMemory != 10<<30 {
			t.Fatalf("env %v: Devices() = %+v, want the MIG instance as CUDA 0 with its 10 GiB", env, devs)
		}
		if _, used, total, err := p.MemoryInfo(0); err != nil || used != one.used || total != one.total {
			t.Errorf("env %v: MemoryInfo = %d/%d, %v; want the instance's readings", env, used, total, err)
		}
	}

	p := mockNVML(t, true, map[string]string{"CUDA_VISIBLE_DEVICES": inst(1).uuid + "," + inst(2).uuid}, parent(inst(1), inst(2)))
	devs, err := p.Devices()
	if err != nil || len(devs) != 1 || len(p.DeviceWarnings()) != 1 {
		t.Fatalf("two instances: %+v, %v, warnings %v; want one kept and a warning", devs, err, p.DeviceWarnings())
	}

	_, err = mockNVML(t, true, nil, parent()).Devices()
	pr, ok := ortenv.DiagnoseCUDA(err)
	if !errors.Is(err, ErrMIGNoPermission) || !errors.Is(err, ErrNoGPU) || !ok || pr.Kind != ortenv.ProblemMIGPermission {
		t.Fatalf("MIG mode without a readable instance: %v (diagnosis %+v), want mig_no_permission", err, pr)
	}
}

// With CUDA_DEVICE_ORDER=PCI_BUS_ID, CUDA numbers GPUs by PCI bus id, so the
// probe does too, whatever NVML's index order; each device carries its bus
// id.
func TestNVMLPCIBusOrder(t *testing.T) {
	a, b := gpuN(0), gpuN(1)
	a.pci, b.pci = "00000000:CA:00.0", "00000000:17:00.0"
	for _, tc := range []struct {
		env   map[string]string
		first string
	}{
		{map[string]string{"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}, b.uuid},
		{map[string]string{"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": "1"}, a.uuid},
		{map[string]string{"CUDA_DEVICE_ORDER": "FASTEST_FIRST"}, a.uuid},
	} {
		devs, err := mockNVML(t, true, tc.env, a, b).Devices()
		if err != nil || devs[0].UUID != tc.first || devs[0].PCIBusID == "" {
			t.Errorf("env %v: %+v, %v; want cuda:0 = %s with its bus id", tc.env, devs, err, tc.first)
		}
	}
}

// The NVIDIA device plugin gives a pod its MIG instance as
// NVIDIA_VISIBLE_DEVICES=MIG-<uuid> and sets no CUDA_VISIBLE_DEVICES: the
// container runtime then exposes that instance alone, so it is CUDA's
// device 0 and the pool uses it (cuda mode starts on it). Naming it in
// either variable is enough; a runtime list of several MIG instances, or
// one that is not the instance NVML reads, still needs CUDA_VISIBLE_DEVICES.
func TestNVMLMIGDevicePlugin(t *testing.T) {
	inst := func(n int) *mockGPU {
		return &mockGPU{uuid: fmt.Sprintf("MIG-%d5a8c9c8-0a37-5f55-9c1e-5a0c3d0e2f11", n), name: "ignored", total: 10 << 30, used: 1 << 30}
	}
	parent := func(migs ...*mockGPU) *mockGPU {
		g := gpuN(0)
		g.migMode, g.migs = true, migs
		g.memV2Ret, g.memV1Ret = nvml.ERROR_NO_PERMISSION, nvml.ERROR_NO_PERMISSION
		return g
	}
	one, two := inst(1), inst(2)
	for _, env := range []map[string]string{
		{"NVIDIA_VISIBLE_DEVICES": one.uuid},
		{"NVIDIA_VISIBLE_DEVICES": " " + strings.ToLower(one.uuid) + " "},
		{"NVIDIA_VISIBLE_DEVICES": one.uuid, "CUDA_VISIBLE_DEVICES": "0"},
		{"NVIDIA_VISIBLE_DEVICES": one.uuid, "CUDA_VISIBLE_DEVICES": one.uuid[:12]},
		{"NVIDIA_VISIBLE_DEVICES": "all", "CUDA_VISIBLE_DEVICES": one.uuid},
	} {
		p := mockNVML(t, true, env, parent(nil, one))
		devs, err := p.Devices()
		if err != nil {
			t.Errorf("env %v: %v", env, err)
			continue
		}
		if len(devs) != 1 || !devs[0].MIG || devs[0].UUID != one.uuid || devs[0].Index != 0 || devs[0].TotalMemory != 10<<30 {
			t.Errorf("env %v: Devices() = %+v, want the MIG instance as CUDA 0 with its 10 GiB", env, devs)
		}
		if _, used, total, err := p.MemoryInfo(0); err != nil || used != one.used || total != one.total {
			t.Errorf("env %v: MemoryInfo = %d/%d, %v; want the instance's readings", env, used, total, err)
		}
	}
	for _, tc := range []struct {
		env  map[string]string
		gpus []*mockGPU
	}{
		{map[string]string{"NVIDIA_VISIBLE_DEVICES": "all"}, []*mockGPU{parent(one)}},
		{map[string]string{"NVIDIA_VISIBLE_DEVICES": "0"}, []*mockGPU{parent(one)}},
		{map[string]string{"NVIDIA_VISIBLE_DEVICES": two.uuid}, []*mockGPU{parent(one)}},
		// Two instances handed over: CUDA takes one of them by its own rules.
		{map[string]string{"NVIDIA_VISIBLE_DEVICES": one.uuid + "," + two.uuid}, []*mockGPU{parent(one, two)}},
	} {
		_, err := mockNVML(t, true, tc.env, tc.gpus...).Devices()
		if !errors.Is(err, ErrMIGNeedsUUID) || !errors.Is(err, ErrNoGPU) {
			t.Errorf("env %v: err = %v, want ErrMIGNeedsUUID", tc.env, err)
		}
	}

	// The whole path: cuda mode starts on the plugin's instance.
	env := map[string]string{"NVIDIA_VISIBLE_DEVICES": one.uuid}
	pool := newPool(t, newFakeFactory(nil), gpuOpts(nil, WithProbe(mockNVML(t, true, env, parent(nil, one))))...)
	if devs := pool.Devices(); len(devs) != 1 || devs[0].Kind != CUDA || devs[0].UUID != one.uuid || devs[0].Index != 0 {
		t.Fatalf("cuda mode under the device plugin: Devices() = %+v, want cuda:0 = %s", devs, one.uuid)
	}
	mustScore(t, pool, makePairs([]int{4, 8, 16}))
}
