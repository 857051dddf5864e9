package gpupool

import (
	"errors"
	"fmt"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/scorer/scorer/model/ortenv"
)

// DeviceInfo is what a Probe knows about one GPU at start.
type DeviceInfo struct {
	// Index is the CUDA device ordinal: the CUDA provider's device_id and
	// the index the Probe's other methods take. It equals NVMLIndex unless
	// CUDA_VISIBLE_DEVICES renumbers the GPUs.
	Index int
	// NVMLIndex is the GPU's index in NVML's own enumeration, for logs.
	NVMLIndex   int
	UUID, Name  string
	TotalMemory uint64
	// PCIBusID is the GPU's PCI address ("00000000:17:00.0"), the order
	// CUDA_DEVICE_ORDER=PCI_BUS_ID numbers by; empty when unknown.
	PCIBusID string
	// MIG is set for a MIG instance: UUID is then the instance's "MIG-…"
	// and TotalMemory its own share.
	MIG bool
}

// Probe is the pool's narrow view of NVML: listing GPUs and reading the
// numbers admission control needs. It exists so admission is testable
// without a GPU; NewNVMLProbe is the real implementation. Methods must be
// safe for concurrent use. Errors should wrap ErrNoGPU, ErrNotSupported or
// ErrGPULost where those apply, because the pool reacts to each differently.
type Probe interface {
	// Devices lists every usable GPU visible to CUDA, in CUDA's order; an
	// error wrapping ErrNoGPU means there is none (no driver, no library,
	// zero devices, none visible, every one broken).
	Devices() ([]DeviceInfo, error)
	// MemoryInfo reads a GPU's current free, used and total memory in bytes.
	MemoryInfo(idx int) (free, used, total uint64, err error)
	// Utilization reads the percentage of time the GPU was busy recently.
	Utilization(idx int) (gpu uint32, err error)
	// Throttled reads the clocks-event (throttle) reason bitmask.
	Throttled(idx int) (reasons uint64, err error)
}

// UnavailableProbe is the Probe of a host where NVML could not be opened:
// every call returns err, NewNVMLProbe's error. A caller that opens NVML
// for the whole process (once) and failed hands it to the pool through
// WithProbe: the pool then takes err as why no GPU works, exactly as if it
// had opened NVML itself and failed (auto mode: the CPU, with err as the one
// warning's reason; cuda mode: an error naming it), without loading NVML a
// second time. A nil err reads as ErrNoGPU.
func UnavailableProbe(err error) Probe {
	if err == nil {
		err = ErrNoGPU
	}
	return unavailableProbe{err}
}

type unavailableProbe struct{ err error }

func (u unavailableProbe) Devices() ([]DeviceInfo, error)                 { return nil, u.err }
func (u unavailableProbe) MemoryInfo(int) (uint64, uint64, uint64, error) { return 0, 0, 0, u.err }
func (u unavailableProbe) Utilization(int) (uint32, error)                { return 0, u.err }
func (u unavailableProbe) Throttled(int) (uint64, error)                  { return 0, u.err }

// Typed NVML outcomes. The NVML adapter maps nvml.Return codes onto these in
// one place (nvmlError), so the rest of the pool reasons about states, not
// driver codes.
var (
	// ErrNoGPU means no GPU can be used at all: the NVML library is missing,
	// the driver is not loaded, or NVML lists zero devices. In auto mode the
	// pool answers it by scoring on the CPU. It is ortenv.ErrNoGPU, which
	// DiagnoseCUDA reads.
	ErrNoGPU = ortenv.ErrNoGPU
	// ErrNotSupported means the device or driver lacks a query; the pool
	// treats that reading as unknown rather than as a failure.
	ErrNotSupported = errors.New("gpupool: NVML query not supported")
	// ErrGPULost means the GPU fell off the bus or needs a reset; the pool
	// marks it degraded immediately.
	ErrGPULost = errors.New("gpupool: GPU is lost")
	// ErrProcessNotListed means NVML answered the per-process query but did
	// not list this process, as happens in containers with their own PID
	// namespace (NVML reports host PIDs).
	ErrProcessNotListed = errors.New("gpupool: this process is not in the GPU's process list")
)

// ProcessMemoryReader is an optional Probe extension: the device memory this
// process alone holds on a GPU. Calibration uses it when it answers, so that
// another process allocating on the same GPU at the same time does not leak
// into our measurements; device-wide used memory is the fallback.
// ProcessMemory should wrap ErrNotSupported or ErrProcessNotListed when it
// cannot tell, and ErrGPULost when the GPU is gone.
type ProcessMemoryReader interface {
	ProcessMemory(idx int) (used uint64, err error)
}

// DeviceReporter is an optional Probe extension: DeviceWarnings says what the
// last successful Devices call left out (a lost GPU, one whose memory cannot
// be read, CUDA_VISIBLE_DEVICES entries CUDA ignores) or cannot vouch for,
// so the probe's owner can log it once. It is empty after a failed Devices,
// whose error carries the reasons.
type DeviceReporter interface {
	DeviceWarnings() []error
}

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

// NVMLReturn is NVML's own return code, which ortenv.DiagnoseCUDA reads
// to tell a missing driver from a GPU-less one.
func (e *nvmlStateError) NVMLReturn() nvml.Return { return e.ret }

// SystemInfo is what the NVIDIA driver says about itself.
type SystemInfo struct {
	// DriverVersion is the kernel driver's version, e.g. "580.65.06".
	DriverVersion string
	// CUDADriverVersion is the newest CUDA the driver supports, as CUDA
	// encodes it (13000 = 13.0); the CUDA 13 providers need >= 13000.
	CUDADriverVersion int
}

// SystemReporter is an optional Probe extension for diagnostics (`scorer
// doctor`): the driver's versions.
type SystemReporter interface {
	System() (SystemInfo, error)
}
