package gpupool

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/scorer/scorer/gpupool/hostcheck"
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

// Typed NVML outcomes. The NVML adapter maps nvml.Return codes onto these in
// one place (nvmlError), so the rest of the pool reasons about states, not
// driver codes.
var (
	// ErrNoGPU means no GPU can be used at all: the NVML library is missing,
	// the driver is not loaded, or NVML lists zero devices. In auto mode the
	// pool answers it by scoring on the CPU. It is hostcheck.ErrNoGPU, which
	// DiagnoseCUDA reads.
	ErrNoGPU = hostcheck.ErrNoGPU
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

// NVMLReturn is NVML's own return code, which hostcheck.DiagnoseCUDA reads
// to tell a missing driver from a GPU-less one.
func (e *nvmlStateError) NVMLReturn() nvml.Return { return e.ret }

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

// ErrMIGNeedsUUID means a MIG instance would be used without
// CUDA_VISIBLE_DEVICES naming it by its MIG-… UUID. CUDA then picks an
// instance by its own rules, and which one NVML's readings (admission's
// memory) belong to would be a guess; with the UUID both sides agree. It is
// hostcheck's sentinel, which DiagnoseCUDA reads.
var ErrMIGNeedsUUID = hostcheck.ErrMIGNeedsUUID

// ErrMIGNoPermission means a GPU is in MIG mode and NVML refuses this
// process the parent GPU's readings (hostcheck's sentinel).
var ErrMIGNoPermission = hostcheck.ErrMIGNoPermission

// migByUUID requires that every MIG instance in visible was selected by a
// MIG-… entry of CUDA_VISIBLE_DEVICES (a unique prefix is enough).
func migByUUID(visible []nvmlGPU, lookupEnv func(string) (string, bool)) error {
	raw, _ := lookupEnv("CUDA_VISIBLE_DEVICES")
	var missing []string
	for _, g := range visible {
		if !g.mig || g.uuid == "" || g.err != nil {
			continue
		}
		named := false
		for _, e := range strings.Split(raw, ",") {
			e = strings.TrimSpace(e)
			if len(e) > len("MIG-") && strings.HasPrefix(strings.ToUpper(e), "MIG-") && len(e) <= len(g.uuid) && strings.EqualFold(g.uuid[:len(e)], e) {
				named = true
			}
		}
		if !named {
			missing = append(missing, g.uuid)
		}
	}
	if len(missing) == 0 {
		return nil
	}
	return fmt.Errorf("%w: CUDA_VISIBLE_DEVICES=%q, MIG instance(s) readable here: %s: %w", ErrMIGNeedsUUID, raw, strings.Join(missing, ", "), ErrNoGPU)
}

// pciOrder sorts GPUs by PCI bus id, CUDA's order under
// CUDA_DEVICE_ORDER=PCI_BUS_ID (which the service sets when unset): NVML's
// own index order is usually the same but not promised. Without every bus
// id known, NVML order stands. MIG instances of one GPU keep their order.
func pciOrder(gs []nvmlGPU) []nvmlGPU {
	for _, g := range gs {
		if g.pciBusID == "" {
			return gs
		}
	}
	out := slices.Clone(gs)
	slices.SortStableFunc(out, func(a, b nvmlGPU) int {
		return strings.Compare(strings.ToLower(a.pciBusID), strings.ToLower(b.pciBusID))
	})
	return out
}

// busID reads NVML's NUL-terminated PCI bus id.
func busID(raw []int8) string {
	b := make([]byte, 0, len(raw))
	for _, c := range raw {
		if c == 0 {
			break
		}
		b = append(b, byte(c))
	}
	return string(b)
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

// visibleGPUs applies CUDA_VISIBLE_DEVICES to NVML's GPUs. NVML ignores the
// variable while CUDA numbers only the GPUs it lists, in its order, so a
// GPU's CUDA device_id is its position in the result. Unset, every GPU is
// visible in NVML order. Entries are CUDA's: indexes, GPU UUIDs or unique
// UUID prefixes ("GPU-8932f937"). Like CUDA, the list ends at the first entry
// that names no GPU ("-1", an index past the last GPU, a repeat), and the
// rest is ignored with a warning. A MIG device ("MIG-…") cannot be mapped to
// a whole GPU's memory readings, so it is an error, as is a list that leaves
// no GPU visible; both wrap ErrNoGPU. Integer indexes follow
// CUDA_DEVICE_ORDER while NVML enumerates by PCI bus ID, so GPUs of
// different models without CUDA_DEVICE_ORDER=PCI_BUS_ID get a warning.
func visibleGPUs(all []nvmlGPU, lookupEnv func(string) (string, bool)) ([]nvmlGPU, []error, error) {
	raw, set := lookupEnv("CUDA_VISIBLE_DEVICES")
	if !set {
		out, warnings := oneMIG(all, orderWarning(all, lookupEnv))
		return out, warnings, nil
	}
	var (
		out      []nvmlGPU
		warnings []error
		byIndex  bool
	)
	entries := strings.Split(raw, ",")
	for k, e := range entries {
		e = strings.TrimSpace(e)
		i, err := matchVisible(all, e)
		if err != nil {
			return nil, nil, fmt.Errorf("gpupool: CUDA_VISIBLE_DEVICES=%q: %w", raw, err)
		}
		if i < 0 || slices.ContainsFunc(out, func(g nvmlGPU) bool { return g.index == all[i].index && g.uuid == all[i].uuid }) {
			if e != "" || k < len(entries)-1 {
				warnings = append(warnings, fmt.Errorf("gpupool: CUDA_VISIBLE_DEVICES=%q: CUDA stops at entry %q and ignores it and the rest", raw, e))
			}
			break
		}
		if _, err := strconv.Atoi(e); err == nil {
			byIndex = true
		}
		out = append(out, all[i])
	}
	if len(out) == 0 {
		return nil, nil, fmt.Errorf("gpupool: CUDA_VISIBLE_DEVICES=%q makes no GPU visible to CUDA: %w", raw, ErrNoGPU)
	}
	out, warnings = oneMIG(out, warnings)
	if byIndex {
		warnings = append(warnings, orderWarning(out, lookupEnv)...)
	}
	return out, warnings, nil
}

// matchVisible finds the position in all of the device one
// CUDA_VISIBLE_DEVICES entry names, or -1 for an entry that names no device
// (where CUDA stops). Integers are positions (CUDA's own numbering of the
// listed devices); "GPU-…" and "MIG-…" are UUIDs or unique prefixes of one.
func matchVisible(all []nvmlGPU, e string) (int, error) {
	if n, err := strconv.Atoi(e); err == nil {
		if n < 0 || n >= len(all) {
			return -1, nil
		}
		return n, nil
	}
	upper := strings.ToUpper(e)
	prefix := ""
	for _, p := range []string{"GPU-", "MIG-"} {
		if strings.HasPrefix(upper, p) && len(e) > len(p) {
			prefix = p
		}
	}
	if prefix == "" {
		return -1, nil
	}
	match, unread := -1, false
	for k, g := range all {
		if g.uuid == "" {
			unread = true
			continue
		}
		if len(e) <= len(g.uuid) && strings.EqualFold(g.uuid[:len(e)], e) {
			if match >= 0 {
				return -1, fmt.Errorf("entry %q matches more than one GPU: %w", e, ErrNoGPU)
			}
			match = k
		}
	}
	if match < 0 && prefix == "MIG-" {
		return -1, fmt.Errorf("entry %q names a MIG instance this process cannot read (NVML lists none with that UUID): %w: %w", e, ErrMIGNoPermission, ErrNoGPU)
	}
	if match < 0 && unread {
		// It may name the GPU whose UUID NVML cannot read; then neither it
		// nor any later entry has a known CUDA number.
		return -1, fmt.Errorf("entry %q matches no GPU whose UUID NVML can read: %w", e, ErrNoGPU)
	}
	return match, nil
}

// oneMIG keeps at most one MIG instance: CUDA uses a single MIG compute
// instance per process and ignores the others, so listing more would open
// sessions on CUDA ordinals that do not exist.
func oneMIG(gs []nvmlGPU, warnings []error) ([]nvmlGPU, []error) {
	seen := false
	var out []nvmlGPU
	for _, g := range gs {
		if g.mig {
			if seen {
				warnings = append(warnings, fmt.Errorf("gpupool: MIG instance %s left out: CUDA uses one MIG instance per process", g.uuid))
				continue
			}
			seen = true
		}
		out = append(out, g)
	}
	return out, warnings
}

// orderWarning warns when CUDA's numbering may not be NVML's: GPUs of
// different models under CUDA's default FASTEST_FIRST order.
func orderWarning(gs []nvmlGPU, lookupEnv func(string) (string, bool)) []error {
	if order, _ := lookupEnv("CUDA_DEVICE_ORDER"); order == "PCI_BUS_ID" {
		return nil
	}
	for _, g := range gs {
		if g.name != "" && gs[0].name != "" && g.name != gs[0].name {
			return []error{errors.New("gpupool: GPUs of different models without CUDA_DEVICE_ORDER=PCI_BUS_ID: " +
				"CUDA may number them differently from NVML; set CUDA_DEVICE_ORDER=PCI_BUS_ID")}
		}
	}
	return nil
}

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
