package gpupool

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// DeviceInfo is what a Probe knows about one GPU at start.
type DeviceInfo struct {
	Index       int
	UUID, Name  string
	TotalMemory uint64
}

// Probe is the pool's narrow view of NVML: listing GPUs and reading the
// numbers admission control needs. It exists so admission is testable
// without a GPU; NewNVMLProbe is the real implementation. Methods must be
// safe for concurrent use. Errors should wrap ErrNoGPU, ErrNotSupported or
// ErrGPULost where those apply, because the pool reacts to each differently.
type Probe interface {
	// Devices lists every GPU; an error wrapping ErrNoGPU means there is
	// none (no driver, no library, zero devices).
	Devices() ([]DeviceInfo, error)
	// MemoryInfo reads a GPU's current free, used and total memory in bytes.
	MemoryInfo(idx int) (free, used, total uint64, err error)
	// Utilization reads the percentage of time the GPU was busy recently.
	Utilization(idx int) (gpu uint32, err error)
	// Throttled reads the clocks-event (throttle) reason bitmask.
	Throttled(idx int) (reasons uint64, err error)
}

// Typed NVML outcomes. The NVML adapter maps nvml.Return codes onto these in
// one place (nvmlError), so the rest of the pool reasons about states, not
// driver codes.
var (
	// ErrNoGPU means no GPU can be used at all: the NVML library is missing,
	// the driver is not loaded, or NVML lists zero devices. In auto mode the
	// pool answers it by scoring on the CPU.
	ErrNoGPU = errors.New("gpupool: no GPU")
	// ErrNotSupported means the device or driver lacks a query; the pool
	// treats that reading as unknown rather than as a failure.
	ErrNotSupported = errors.New("gpupool: NVML query not supported")
	// ErrGPULost means the GPU fell off the bus or needs a reset; the pool
	// marks it degraded immediately.
	ErrGPULost = errors.New("gpupool: GPU is lost")
)

// throttleHotMask holds the throttle reasons that mean the device is slowing
// itself down (power cap, thermal, hardware slowdown), as opposed to benign
// ones like idle or application clock settings.
const throttleHotMask = uint64(nvml.ClocksEventReasonSwPowerCap |
	nvml.ClocksThrottleReasonHwSlowdown |
	nvml.ClocksEventReasonSwThermalSlowdown |
	nvml.ClocksThrottleReasonHwThermalSlowdown |
	nvml.ClocksThrottleReasonHwPowerBrakeSlowdown)

// nvmlError turns an NVML return code into an error: nil for SUCCESS, one of
// the typed sentinels where the pool reacts specifically, and a plain wrapped
// error otherwise. It is the only place that interprets nvml.Return.
func nvmlError(op string, ret nvml.Return) error {
	switch ret {
	case nvml.SUCCESS:
		return nil
	case nvml.ERROR_LIBRARY_NOT_FOUND, nvml.ERROR_DRIVER_NOT_LOADED:
		return &nvmlStateError{op: op, state: ErrNoGPU, ret: ret}
	case nvml.ERROR_NOT_SUPPORTED, nvml.ERROR_FUNCTION_NOT_FOUND:
		return &nvmlStateError{op: op, state: ErrNotSupported, ret: ret}
	case nvml.ERROR_GPU_IS_LOST, nvml.ERROR_RESET_REQUIRED:
		return &nvmlStateError{op: op, state: ErrGPULost, ret: ret}
	}
	return fmt.Errorf("gpupool: nvml %s: %w", op, ret)
}

// nvmlStateError is an NVML answer the pool treats as a device state. It
// unwraps to the state's sentinel; its text names the sentinel once, without
// repeating the package prefix that both it and the sentinel carry.
type nvmlStateError struct {
	op    string
	state error
	ret   nvml.Return
}

func (e *nvmlStateError) Error() string {
	return fmt.Sprintf("gpupool: nvml %s: %s (%v)", e.op, strings.TrimPrefix(e.state.Error(), "gpupool: "), e.ret)
}

func (e *nvmlStateError) Unwrap() error { return e.state }

// nvmlInitTimeout bounds nvml.Init when the caller's ctx has no deadline:
// Init has been seen to hang on broken drivers (go-nvml #152), and a hung
// start is worse than a CPU start.
const nvmlInitTimeout = 10 * time.Second

// nvmlProbe adapts go-nvml to Probe. Device handles are looked up once at
// Devices and reused, because handle lookup is the expensive call.
type nvmlProbe struct {
	lib      nvml.Interface
	memoryV2 bool // nvmlDeviceGetMemoryInfo_v2 exists in the loaded driver
	events   bool // nvmlDeviceGetCurrentClocksEventReasons exists

	mu      sync.Mutex
	handles map[int]nvml.Device
}

// NewNVMLProbe initialises NVML and returns a Probe over it and the shutdown
// that undoes the Init. Init runs under ctx (or nvmlInitTimeout when ctx has
// no deadline) because it can hang; if it times out, the late Init is shut
// down when it finally returns. On a machine with no NVML library the error
// wraps ErrNoGPU, never a crash. Call shutdown once, after the pool is
// closed.
func NewNVMLProbe(ctx context.Context) (Probe, func(), error) {
	return newNVMLProbe(ctx, nvml.New())
}

func newNVMLProbe(ctx context.Context, lib nvml.Interface) (Probe, func(), error) {
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
	p := &nvmlProbe{lib: lib, handles: map[int]nvml.Device{}}
	// Versioned and renamed symbols are missing on older drivers; calling a
	// missing symbol would crash, so look them up once.
	ext := lib.Extensions()
	p.memoryV2 = ext.LookupSymbol("nvmlDeviceGetMemoryInfo_v2") == nil
	p.events = ext.LookupSymbol("nvmlDeviceGetCurrentClocksEventReasons") == nil
	var once sync.Once
	return p, func() { once.Do(func() { lib.Shutdown() }) }, nil
}

func (p *nvmlProbe) handle(idx int) (nvml.Device, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if h, ok := p.handles[idx]; ok {
		return h, nil
	}
	h, ret := p.lib.DeviceGetHandleByIndex(idx)
	if err := nvmlError(fmt.Sprintf("device %d handle", idx), ret); err != nil {
		return nil, err
	}
	p.handles[idx] = h
	return h, nil
}

// Devices lists every GPU NVML sees; zero devices wraps ErrNoGPU.
func (p *nvmlProbe) Devices() ([]DeviceInfo, error) {
	n, ret := p.lib.DeviceGetCount()
	if err := nvmlError("device count", ret); err != nil {
		return nil, err
	}
	if n == 0 {
		return nil, fmt.Errorf("gpupool: nvml lists zero devices: %w", ErrNoGPU)
	}
	out := make([]DeviceInfo, 0, n)
	for i := 0; i < n; i++ {
		h, err := p.handle(i)
		if err != nil {
			return nil, err
		}
		uuid, ret := p.lib.DeviceGetUUID(h)
		if err := nvmlError(fmt.Sprintf("device %d uuid", i), ret); err != nil {
			return nil, err
		}
		name, ret := p.lib.DeviceGetName(h)
		if err := nvmlError(fmt.Sprintf("device %d name", i), ret); err != nil {
			return nil, err
		}
		_, _, total, err := p.MemoryInfo(i)
		if err != nil {
			return nil, err
		}
		out = append(out, DeviceInfo{Index: i, UUID: uuid, Name: name, TotalMemory: total})
	}
	return out, nil
}

// MemoryInfo prefers the v2 query, whose "used" excludes driver-reserved
// memory and so matches what allocations actually compete for; v1 is the
// fallback for drivers that lack v2.
func (p *nvmlProbe) MemoryInfo(idx int) (free, used, total uint64, err error) {
	h, err := p.handle(idx)
	if err != nil {
		return 0, 0, 0, err
	}
	if p.memoryV2 {
		m, ret := p.lib.DeviceGetMemoryInfo_v2(h)
		if ret == nvml.SUCCESS {
			return m.Free, m.Used, m.Total, nil
		}
		if err := nvmlError("memory info v2", ret); !errors.Is(err, ErrNotSupported) {
			return 0, 0, 0, err
		}
	}
	m, ret := p.lib.DeviceGetMemoryInfo(h)
	if err := nvmlError(fmt.Sprintf("device %d memory info", idx), ret); err != nil {
		return 0, 0, 0, err
	}
	return m.Free, m.Used, m.Total, nil
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
