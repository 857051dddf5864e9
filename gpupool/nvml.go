package gpupool

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// nvmlInitTimeout bounds nvml.Init when the caller's ctx has no deadline:
// Init has been seen to hang on broken drivers (go-nvml #152), and a hung
// start is worse than a CPU start.
const nvmlInitTimeout = 10 * time.Second

// nvmlProbe adapts go-nvml to Probe. Device handles are looked up once at
// Devices and reused, because handle lookup is the expensive call.
type nvmlProbe struct {
	lib       nvml.Interface
	memoryV2  bool // nvmlDeviceGetMemoryInfo_v2 exists in the loaded driver
	events    bool // nvmlDeviceGetCurrentClocksEventReasons exists
	lookupEnv func(string) (string, bool)
	pid       int

	mu       sync.Mutex
	handles  map[int]nvml.Device // by NVML index
	ordinals map[int]nvml.Device // by CUDA ordinal; nil until Devices succeeds
	warnings []error             // from the last successful Devices
}

// NVMLOption configures NewNVMLProbe.
type NVMLOption func(*nvmlProbe)

// NVMLLookupEnv sets how the probe reads CUDA_VISIBLE_DEVICES and
// CUDA_DEVICE_ORDER (default os.LookupEnv: set-but-empty hides every GPU,
// unlike unset). The CUDA runtime reads the real process environment, so
// production passes os.LookupEnv; tests pass a map lookup.
func NVMLLookupEnv(fn func(string) (string, bool)) NVMLOption {
	return func(p *nvmlProbe) { p.lookupEnv = fn }
}

// NewNVMLProbe initialises NVML and returns a Probe over it and the shutdown
// that undoes the Init. Init runs under ctx (or nvmlInitTimeout when ctx has
// no deadline) because it can hang; if it times out, the late Init is shut
// down when it finally returns. On a machine with no NVML library the error
// wraps ErrNoGPU, never a crash. Call shutdown once, after the pool is
// closed.
func NewNVMLProbe(ctx context.Context, opts ...NVMLOption) (Probe, func(), error) {
	return newNVMLProbe(ctx, nvml.New(), opts...)
}

func newNVMLProbe(ctx context.Context, lib nvml.Interface, opts ...NVMLOption) (Probe, func(), error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, nvmlInitTimeout)
		defer cancel()
	}
	type result struct{ ret nvml.Return }
	done := make(chan result, 1)
	var mu sync.Mutex
	abandoned := false
	go func() {
		ret := lib.Init()
		mu.Lock()
		defer mu.Unlock()
		if abandoned && ret == nvml.SUCCESS {
			// Nobody will use this Init; balance it so the library's
			// reference count does not leak.
			lib.Shutdown()
			return
		}
		done <- result{ret}
	}()
	var r result
	select {
	case r = <-done:
	case <-ctx.Done():
		mu.Lock()
		select {
		case r = <-done: // finished while we took the lock
			mu.Unlock()
		default:
			abandoned = true
			mu.Unlock()
			return nil, nil, fmt.Errorf("gpupool: nvml init: %w", ctx.Err())
		}
	}
	if err := nvmlError("init", r.ret); err != nil {
		return nil, nil, err
	}
	p := &nvmlProbe{lib: lib, handles: map[int]nvml.Device{}, lookupEnv: os.LookupEnv, pid: os.Getpid()}
	for _, o := range opts {
		o(p)
	}
	// Versioned and renamed symbols are missing on older drivers; calling a
	// missing symbol would crash, so look them up once.
	ext := lib.Extensions()
	p.memoryV2 = ext.LookupSymbol("nvmlDeviceGetMemoryInfo_v2") == nil
	p.events = ext.LookupSymbol("nvmlDeviceGetCurrentClocksEventReasons") == nil
	var once sync.Once
	return p, func() { once.Do(func() { lib.Shutdown() }) }, nil
}

// nvmlHandle returns the handle of the GPU at NVML index i.
func (p *nvmlProbe) nvmlHandle(i int) (nvml.Device, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if h, ok := p.handles[i]; ok {
		return h, nil
	}
	h, ret := p.lib.DeviceGetHandleByIndex(i)
	if err := nvmlError(fmt.Sprintf("device %d handle", i), ret); err != nil {
		return nil, err
	}
	p.handles[i] = h
	return h, nil
}

// handle returns the handle of the GPU at CUDA ordinal idx, the index the
// pool uses. Until Devices has mapped the ordinals, idx is an NVML index.
func (p *nvmlProbe) handle(idx int) (nvml.Device, error) {
	p.mu.Lock()
	ordinals := p.ordinals
	p.mu.Unlock()
	if ordinals == nil {
		return p.nvmlHandle(idx)
	}
	if h, ok := ordinals[idx]; ok {
		return h, nil
	}
	return nil, fmt.Errorf("gpupool: no usable GPU has CUDA index %d", idx)
}

// nvmlGPU is one GPU as NVML enumerates it; err says why it cannot be used.
type nvmlGPU struct {
	index      int
	handle     nvml.Device
	uuid, name string
	total      uint64
	pciBusID   string
	mig        bool      // a MIG instance, or (with migs) a GPU in MIG mode
	migs       []nvmlGPU // a MIG-mode GPU's readable instances
	err        error
}

// Devices lists the GPUs CUDA will see, in CUDA's order (visibleGPUs), each
// under its CUDA ordinal. A GPU that fails a query (lost, memory info not
// supported) is left out with a warning (DeviceWarnings) instead of hiding
// the others; only when none is usable is it ErrNoGPU.
func (p *nvmlProbe) Devices() ([]DeviceInfo, error) {
	n, ret := p.lib.DeviceGetCount()
	if err := nvmlError("device count", ret); err != nil {
		return nil, err
	}
	if n == 0 {
		return nil, fmt.Errorf("gpupool: nvml lists zero devices: %w", ErrNoGPU)
	}
	var all []nvmlGPU
	for i := range n {
		g := p.readGPU(i)
		if g.mig && len(g.migs) > 0 {
			// In MIG mode CUDA sees the instances, not the GPU: they are
			// the devices, with their own handles, UUIDs and memory.
			all = append(all, g.migs...)
			continue
		}
		all = append(all, g)
	}
	if order, _ := p.lookupEnv("CUDA_DEVICE_ORDER"); order == "PCI_BUS_ID" {
		all = pciOrder(all)
	}
	visible, warnings, err := visibleGPUs(all, p.lookupEnv)
	if err != nil {
		return nil, err
	}
	if err := migByUUID(visible, p.lookupEnv); err != nil {
		return nil, err
	}
	out := make([]DeviceInfo, 0, len(visible))
	ordinals := make(map[int]nvml.Device, len(visible))
	var skipped []error
	for ordinal, g := range visible {
		if g.err != nil {
			skipped = append(skipped, fmt.Errorf("gpupool: skipping GPU %d (NVML index %d, %s): %w",
				ordinal, g.index, cmp.Or(g.uuid, "UUID unknown"), g.err))
			continue
		}
		ordinals[ordinal] = g.handle
		out = append(out, DeviceInfo{Index: ordinal, NVMLIndex: g.index, UUID: g.uuid, Name: g.name, TotalMemory: g.total,
			PCIBusID: g.pciBusID, MIG: g.mig})
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("gpupool: none of %d visible GPUs is usable: %w", len(visible),
			errors.Join(append([]error{ErrNoGPU}, skipped...)...))
	}
	p.mu.Lock()
	p.ordinals = ordinals
	p.warnings = append(warnings, skipped...)
	p.mu.Unlock()
	return out, nil
}

// DeviceWarnings implements DeviceReporter.
func (p *nvmlProbe) DeviceWarnings() []error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.warnings)
}

// readGPU reads what Devices reports about NVML index i, keeping a failure
// in err.
func (p *nvmlProbe) readGPU(i int) nvmlGPU {
	g := nvmlGPU{index: i}
	h, err := p.nvmlHandle(i)
	if err != nil {
		g.err = err
		return g
	}
	g.handle = h
	// The UUID first: CUDA_VISIBLE_DEVICES may name the GPU by it even if
	// a later query fails.
	uuid, ret := p.lib.DeviceGetUUID(h)
	if g.err = nvmlError(fmt.Sprintf("device %d uuid", i), ret); g.err != nil {
		return g
	}
	g.uuid = uuid
	if g.name, ret = p.lib.DeviceGetName(h); ret != nvml.SUCCESS {
		g.err = nvmlError(fmt.Sprintf("device %d name", i), ret)
		return g
	}
	if pci, ret := p.lib.DeviceGetPciInfo(h); ret == nvml.SUCCESS {
		g.pciBusID = busID(pci.BusId[:])
	}
	if cur, _, ret := p.lib.DeviceGetMigMode(h); ret == nvml.SUCCESS && cur == nvml.DEVICE_MIG_ENABLE {
		// The parent's memory query answers NO_PERMISSION inside a MIG
		// container and is not ours to use anyway: only the instances are.
		g.mig = true
		g.migs = p.readMIGs(h, g)
		if len(g.migs) == 0 {
			g.err = fmt.Errorf("gpupool: device %d (%s) is in MIG mode and no MIG instance is readable: %w: %w", i, g.uuid, ErrMIGNoPermission, ErrNoGPU)
		}
		return g
	}
	_, _, g.total, g.err = p.memoryInfo(h, i)
	return g
}

// readMIGs lists the MIG instances of the MIG-mode GPU h that this process
// can read: in a container given one instance, that one. Empty slots and
// instances NVML refuses are skipped.
func (p *nvmlProbe) readMIGs(h nvml.Device, parent nvmlGPU) []nvmlGPU {
	n, ret := p.lib.DeviceGetMaxMigDeviceCount(h)
	if ret != nvml.SUCCESS {
		return nil
	}
	var out []nvmlGPU
	for k := range n {
		mh, ret := p.lib.DeviceGetMigDeviceHandleByIndex(h, k)
		if ret != nvml.SUCCESS {
			continue
		}
		uuid, ret := p.lib.DeviceGetUUID(mh)
		if ret != nvml.SUCCESS {
			continue
		}
		_, _, total, err := p.memoryInfo(mh, parent.index)
		if err != nil {
			continue
		}
		out = append(out, nvmlGPU{index: parent.index, handle: mh, uuid: uuid, name: parent.name + " MIG",
			total: total, pciBusID: parent.pciBusID, mig: true})
	}
	return out
}

// MemoryInfo prefers the v2 query, whose "used" excludes driver-reserved
// memory and so matches what allocations actually compete for. v1 is the
// fallback whenever v2 fails for a reason other than a lost GPU:
// NOT_SUPPORTED, FUNCTION_NOT_FOUND on older drivers,
// ARGUMENT_VERSION_MISMATCH, and so on.
func (p *nvmlProbe) MemoryInfo(idx int) (free, used, total uint64, err error) {
	h, err := p.handle(idx)
	if err != nil {
		return 0, 0, 0, err
	}
	return p.memoryInfo(h, idx)
}

func (p *nvmlProbe) memoryInfo(h nvml.Device, idx int) (free, used, total uint64, err error) {
	if p.memoryV2 {
		m, ret := p.lib.DeviceGetMemoryInfo_v2(h)
		if ret == nvml.SUCCESS {
			return m.Free, m.Used, m.Total, nil
		}
		if err := nvmlError(fmt.Sprintf("device %d memory info v2", idx), ret); errors.Is(err, ErrGPULost) {
			return 0, 0, 0, err
		}
	}
	m, ret := p.lib.DeviceGetMemoryInfo(h)
	if err := nvmlError(fmt.Sprintf("device %d memory info", idx), ret); err != nil {
		return 0, 0, 0, err
	}
	return m.Free, m.Used, m.Total, nil
}

// ProcessMemory implements ProcessMemoryReader from NVML's list of compute
// processes on the GPU: the memory of the entries with this process's PID
// (one per MIG instance, else one). It wraps ErrProcessNotListed when the PID
// is absent (PID namespaces) and ErrNotSupported when the driver cannot say.
func (p *nvmlProbe) ProcessMemory(idx int) (uint64, error) {
	h, err := p.handle(idx)
	if err != nil {
		return 0, err
	}
	procs, ret := p.lib.DeviceGetComputeRunningProcesses(h)
	if err := nvmlError(fmt.Sprintf("device %d compute processes", idx), ret); err != nil {
		return 0, err
	}
	var used uint64
	found := false
	for _, pr := range procs {
		if int64(pr.Pid) != int64(p.pid) {
			continue
		}
		// NVML_VALUE_NOT_AVAILABLE (-1 as unsigned): the driver cannot
		// attribute memory to processes here.
		if pr.UsedGpuMemory == math.MaxUint64 {
			return 0, fmt.Errorf("gpupool: device %d: per-process memory not available: %w", idx, ErrNotSupported)
		}
		used += pr.UsedGpuMemory
		found = true
	}
	if !found {
		return 0, fmt.Errorf("gpupool: device %d: pid %d not among %d compute processes: %w", idx, p.pid, len(procs), ErrProcessNotListed)
	}
	return used, nil
}

// System implements SystemReporter.
func (p *nvmlProbe) System() (SystemInfo, error) {
	v, ret := p.lib.SystemGetDriverVersion()
	if err := nvmlError("driver version", ret); err != nil {
		return SystemInfo{}, err
	}
	c, ret := p.lib.SystemGetCudaDriverVersion()
	if err := nvmlError("CUDA driver version", ret); err != nil {
		return SystemInfo{DriverVersion: v}, err
	}
	return SystemInfo{DriverVersion: v, CUDADriverVersion: c}, nil
}

// Utilization reads the GPU busy percentage.
func (p *nvmlProbe) Utilization(idx int) (uint32, error) {
	h, err := p.handle(idx)
	if err != nil {
		return 0, err
	}
	u, ret := p.lib.DeviceGetUtilizationRates(h)
	if err := nvmlError(fmt.Sprintf("device %d utilization", idx), ret); err != nil {
		return 0, err
	}
	return u.Gpu, nil
}

// Throttled reads the clocks-event reasons, using the pre-rename
// "throttle reasons" call on drivers that lack the new name.
func (p *nvmlProbe) Throttled(idx int) (uint64, error) {
	h, err := p.handle(idx)
	if err != nil {
		return 0, err
	}
	var r uint64
	var ret nvml.Return
	if p.events {
		r, ret = p.lib.DeviceGetCurrentClocksEventReasons(h)
	} else {
		r, ret = p.lib.DeviceGetCurrentClocksThrottleReasons(h)
	}
	if err := nvmlError(fmt.Sprintf("device %d throttle reasons", idx), ret); err != nil {
		return 0, err
	}
	return r, nil
}
