package gpupool

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
)

// DeviceMode chooses where the pool runs.
type DeviceMode string

const (
	// ModeAuto uses every GPU NVML lists whose CUDA engine opens and falls
	// back to the CPU, with one warning, when none does; with GPUs, a
	// batch no GPU can take opens a CPU engine then (CPUFallback).
	ModeAuto DeviceMode = "auto"
	// ModeCPU never touches NVML or CUDA.
	ModeCPU DeviceMode = "cpu"
	// ModeCUDA means GPUs only, for the pool's life: New fails without at
	// least one working GPU, so a GPU deployment that lost its GPUs does
	// not silently crawl on the CPU, and a batch no GPU can take later (the
	// GPUs degraded, or a pair none can hold) fails its call as
	// CPUFallback(false) says rather than opening a CPU engine.
	ModeCUDA DeviceMode = "cuda"
)

// ParseDeviceMode turns configuration text into a DeviceMode; "" is
// ModeAuto so an unset variable gets the default.
func ParseDeviceMode(s string) (DeviceMode, error) {
	switch DeviceMode(s) {
	case "", ModeAuto:
		return ModeAuto, nil
	case ModeCPU, ModeCUDA:
		return DeviceMode(s), nil
	}
	return "", fmt.Errorf("gpupool: unknown device mode %q (want auto, cpu or cuda)", s)
}

// Shape is one calibration batch: Rows pairs of Len tokens each.
type Shape struct{ Rows, Len int }

// Calibration configures how the pool learns each GPU's memory cost per
// batch. At start every CUDA device runs warm-up batches of the shapes the
// planner builds (every length bucket at the rows the token budget gives,
// and a quarter of those rows at three lengths), each measured from an
// emptied arena where the engine can release it (ArenaReleaser), and fits
// bytes ≈ a + d·rows + b·rows·len + c·rows·len² weighted by relative error;
// admission then asks for that much, plus a 10% fragmentation margin and
// the fit's held-out error, before each batch, and the planner caps rows
// per batch so long pairs fit. The zero value means "calibrate with the
// default shapes".
type Calibration struct {
	// Disabled skips the warm-up runs; admission then uses FallbackBase and
	// FallbackPerToken (e.g. for tests, or when start time matters more).
	Disabled bool
	// Shapes are the warm-up batches; empty means a default ladder that
	// stays inside the token budget and MaxLen.
	Shapes []Shape
	// MaxLen caps the calibration pair length, Shapes included; set it to
	// the model's maximum sequence length (default 512), since the engine
	// rejects longer pairs and a rejected calibration batch drops the GPU.
	MaxLen int
	// TokenID fills the synthetic calibration pairs; any ID valid in the
	// vocabulary works because memory depends on shape, not content
	// (default 1).
	TokenID int32
	// FallbackBase and FallbackPerToken are the estimate used when
	// calibration is disabled or fails (defaults 64 MiB and 256 KiB: a
	// generous guess for base-sized encoders; it has no len² term, so
	// calibrate for models with long inputs).
	FallbackBase, FallbackPerToken uint64
}

// Option configures a Pool. Options are applied over the defaults in order
// and the result is validated by New before any device is touched.
type Option interface{ apply(*cfg) }

type optFunc func(*cfg)

func (f optFunc) apply(c *cfg) { f(c) }

type cfg struct {
	maxBatchTokens    int
	maxBatchRows      int
	cpuBatchTokens    int // 0: no CPU cap
	cpuBatchRows      int // 0: no CPU cap
	workersPerDevice  int
	cpuWorkers        int
	queueCapacity     int
	mode              DeviceMode
	gpuIDs            []string
	memFraction       float64
	headroom          uint64
	probe             Probe
	logger            zerolog.Logger
	reg               prometheus.Registerer
	calibration       Calibration
	gpuCalCache       string // "": every start calibrates
	maxDeviceFailures int
	maxAttempts       int
	cpuFallback       *bool // nil: on in ModeAuto, off in ModeCUDA
	admissionBackoff  time.Duration
	hotUtilization    uint32
	coolUtilization   uint32
	afterCUDAInit     func()
	memLimit          MemLimit
	probation         time.Duration
	cpuMem            *CPUMemoryConfig
	procMem           processMemory // nil: /proc/self
	busyInterval      time.Duration
}

func defaultCfg() cfg {
	return cfg{
		maxBatchTokens:    16384,
		maxBatchRows:      256,
		queueCapacity:     32768,
		mode:              ModeAuto,
		memFraction:       0.8,
		headroom:          256 << 20,
		logger:            zerolog.Nop(),
		maxDeviceFailures: 3,
		maxAttempts:       16,
		admissionBackoff:  20 * time.Millisecond,
		hotUtilization:    95,
		coolUtilization:   80,
		probation:         5 * time.Minute,
		busyInterval:      defaultBusyInterval,
	}
}

func (c *cfg) validate() error {
	var errs []error
	if c.maxBatchTokens < 1 {
		errs = append(errs, fmt.Errorf("MaxBatchTokens %d < 1", c.maxBatchTokens))
	}
	if c.maxBatchRows < 1 {
		errs = append(errs, fmt.Errorf("MaxBatchRows %d < 1", c.maxBatchRows))
	}
	if c.cpuBatchTokens < 0 || c.cpuBatchRows < 0 {
		errs = append(errs, fmt.Errorf("CPUBatchShape %d tokens, %d rows: want >= 0 (0 = no cap)", c.cpuBatchTokens, c.cpuBatchRows))
	}
	if c.cpuWorkers < 0 {
		errs = append(errs, fmt.Errorf("CPUWorkers %d < 0", c.cpuWorkers))
	}
	if c.workersPerDevice < 0 {
		errs = append(errs, fmt.Errorf("WorkersPerDevice %d < 0", c.workersPerDevice))
	}
	// A whole batch must fit in the queue, or a call could wait forever for
	// room that never comes.
	if c.queueCapacity < c.maxBatchRows {
		errs = append(errs, fmt.Errorf("QueueCapacity %d < MaxBatchRows %d", c.queueCapacity, c.maxBatchRows))
	}
	if _, err := ParseDeviceMode(string(c.mode)); err != nil {
		errs = append(errs, err)
	}
	if c.mode == ModeCPU && len(c.gpuIDs) > 0 {
		errs = append(errs, errors.New("GPUIDs given with Mode cpu"))
	}
	if c.mode == ModeCUDA && c.cpuFallback != nil && *c.cpuFallback {
		errs = append(errs, errors.New("CPUFallback(true) given with Mode cuda, which means GPUs only (Mode auto falls back)"))
	}
	if !(c.memFraction > 0 && c.memFraction <= 1) {
		errs = append(errs, fmt.Errorf("MemFraction %v not in (0, 1]", c.memFraction))
	}
	if c.maxDeviceFailures < 1 {
		errs = append(errs, fmt.Errorf("MaxDeviceFailures %d < 1", c.maxDeviceFailures))
	}
	if c.maxAttempts < 1 {
		errs = append(errs, fmt.Errorf("MaxAttempts %d < 1", c.maxAttempts))
	}
	if err := c.memLimit.validate(); err != nil {
		errs = append(errs, err)
	}
	if c.probation <= 0 {
		errs = append(errs, fmt.Errorf("Probation %v <= 0", c.probation))
	}
	if c.admissionBackoff <= 0 {
		errs = append(errs, fmt.Errorf("AdmissionBackoff %v <= 0", c.admissionBackoff))
	}
	if c.coolUtilization >= c.hotUtilization || c.hotUtilization > 100 {
		errs = append(errs, fmt.Errorf("UtilizationHysteresis cool %d, hot %d: want cool < hot <= 100", c.coolUtilization, c.hotUtilization))
	}
	if m := c.cpuMem; m != nil {
		if m.RefLen < 0 {
			errs = append(errs, fmt.Errorf("CPUMemory RefLen %d < 0", m.RefLen))
		}
		if m.Limit > 0 && m.Reserve >= m.Limit {
			errs = append(errs, fmt.Errorf("CPUMemory Reserve %d >= Limit %d", m.Reserve, m.Limit))
		}
		for _, s := range m.Shapes {
			if s.Rows < 1 || s.Len < 1 {
				errs = append(errs, fmt.Errorf("CPU calibration shape %dx%d: rows and len must be >= 1", s.Rows, s.Len))
			}
		}
	}
	for _, s := range c.calibration.Shapes {
		if s.Rows < 1 || s.Len < 1 {
			errs = append(errs, fmt.Errorf("calibration shape %dx%d: rows and len must be >= 1", s.Rows, s.Len))
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("gpupool: invalid options: %w", errors.Join(errs...))
	}
	if c.calibration.MaxLen == 0 {
		c.calibration.MaxLen = 512
	}
	if c.calibration.TokenID == 0 {
		c.calibration.TokenID = 1
	}
	if c.calibration.FallbackBase == 0 {
		c.calibration.FallbackBase = 64 << 20
	}
	if c.calibration.FallbackPerToken == 0 {
		c.calibration.FallbackPerToken = 256 << 10
	}
	return nil
}

// MaxBatchTokens caps rows × padded length of one inference batch (default
// 16384). It bounds activation memory, which grows with the padded size.
func MaxBatchTokens(n int) Option { return optFunc(func(c *cfg) { c.maxBatchTokens = n }) }

// MaxBatchRows caps the pairs in one inference batch (default 256), so many
// short pairs do not build a batch wider than the model was tuned for.
func MaxBatchRows(n int) Option { return optFunc(func(c *cfg) { c.maxBatchRows = n }) }

// CPUBatchShape caps MaxBatchTokens and MaxBatchRows when the pool's own
// device is the CPU (Mode cpu, or auto where no GPU works), the smaller
// value winning; 0 leaves the cap out (default: none). GPUs want wide
// batches and CPUs narrow ones that stay in their caches, and whether a GPU
// works is known only once New has probed, so callers hand the pool both
// shapes and the pool picks. A CPU engine created later as a fallback for
// failing GPUs keeps the GPU shape.
func CPUBatchShape(tokens, rows int) Option {
	return optFunc(func(c *cfg) { c.cpuBatchTokens, c.cpuBatchRows = tokens, rows })
}

// WorkersPerDevice sets how many workers pull batches for each device; 0
// (default) means 1 on the CPU, whose session already uses every core, and 2
// on a GPU, so one batch's host-side work overlaps the other's kernels.
func WorkersPerDevice(n int) Option { return optFunc(func(c *cfg) { c.workersPerDevice = n }) }

// CPUWorkers sets the CPU device's workers, overriding WorkersPerDevice
// there (0 = follow WorkersPerDevice). Several workers sharing one CPU
// session with one intra-op thread each often beat one worker with every
// thread: small models parallelise poorly inside one run (see
// docs/benchmarks.md, CPU scaling).
func CPUWorkers(n int) Option { return optFunc(func(c *cfg) { c.cpuWorkers = n }) }

// withQueueCapacity bounds the pairs admitted into the pool and not yet scored,
// queued or running (default 32768). ScorePairs waits, honouring its ctx,
// while the pool is full: the backpressure that keeps memory bounded.
func withQueueCapacity(pairs int) Option { return optFunc(func(c *cfg) { c.queueCapacity = pairs }) }

// Mode picks auto, cpu or cuda (default auto).
func Mode(m DeviceMode) Option { return optFunc(func(c *cfg) { c.mode = m }) }

// GPUIDs restricts the pool to these GPUs, each a device index ("0") or a
// UUID ("GPU-…"); empty (default) means all. The index is the CUDA
// ordinal: the NVML index, unless CUDA_VISIBLE_DEVICES renumbers the GPUs
// (the NVML probe maps it). UUIDs are the safe choice.
func GPUIDs(ids ...string) Option {
	return optFunc(func(c *cfg) { c.gpuIDs = append([]string(nil), ids...) })
}

// MemFraction is the share of a GPU's memory the pool lets used memory reach
// with a batch's estimate added (default 0.8), leaving room for other
// tenants and fragmentation. SessionFactory callers pass it along as
// SessionConfig.GPUMemFraction, which caps ORT's arena a margin below it.
func MemFraction(f float64) Option { return optFunc(func(c *cfg) { c.memFraction = f }) }

// withHeadroom is the free memory, beyond a batch's estimate, a GPU must keep to
// admit the batch (default 256 MiB); it absorbs estimate error.
func withHeadroom(bytes uint64) Option { return optFunc(func(c *cfg) { c.headroom = bytes }) }

// WithProbe replaces NVML with p (tests, or a caller that owns NVML's
// lifetime). Without it, New opens NVML itself in auto and cuda modes and
// shuts it down at Close. NVML is opened once per process by whoever owns
// it: an owner that could not open it passes UnavailableProbe(err), so the
// pool does not try a second time.
func WithProbe(p Probe) Option { return optFunc(func(c *cfg) { c.probe = p }) }

// Logger sets the pool's logger (default: none).
func Logger(l zerolog.Logger) Option { return optFunc(func(c *cfg) { c.logger = l }) }

// Registerer registers the pool's metrics with r (default nil: no metrics).
func Registerer(r prometheus.Registerer) Option { return optFunc(func(c *cfg) { c.reg = r }) }

// Calibrate sets how GPU memory per batch is learned; see Calibration.
func Calibrate(cal Calibration) Option { return optFunc(func(c *cfg) { c.calibration = cal }) }

// GPUCalibrationCache keeps each GPU's memory calibration in a small file
// in dir, and a later start whose key matches takes it instead of running
// the calibration ladder (tens of thousands of kernel launches, seconds on
// a large model). The key is all the fit depends on: the GPU's UUID, name
// and memory, the engine's MemoryKey (model.Session: the model's SHA-256,
// maximum length and output type, ONNX Runtime's release, the session's
// memory options and its CUDA provider options, TF32 and the arena cap
// among them; an engine without one is never cached), the calibration
// shapes (from Calibration, MaxBatchTokens and MaxBatchRows) and how
// memory was read. What depends on the device's state now (the weights,
// used memory, the memory CUDA takes beside the arena) is measured at
// every start. A mismatched, unreadable or unusable file is measured again
// and overwritten; one log line per GPU says which happened. Empty (the
// default): calibrate at every start.
func GPUCalibrationCache(dir string) Option {
	return optFunc(func(c *cfg) { c.gpuCalCache = dir })
}

// withMaxDeviceFailures is how many consecutive failed runs mark a device
// degraded (default 3); its work then moves to other devices.
func withMaxDeviceFailures(n int) Option { return optFunc(func(c *cfg) { c.maxDeviceFailures = n }) }

// withMaxAttempts bounds how often one batch (or a piece split from it) is
// retried before its ScorePairs call fails (default 16), so a poison batch
// ends in an error rather than a loop.
func withMaxAttempts(n int) Option { return optFunc(func(c *cfg) { c.maxAttempts = n }) }

// CPUFallback says whether a CPU engine is created lazily when no GPU can
// take a batch (default: in ModeAuto only; ModeCUDA refuses true). With
// false such a batch fails its call. The fallback engine has no memory
// budget (CPUMemory calibrates only a pool's own CPU device) and runs the
// batches planned for the GPUs, MaxBatchTokens wide: a last resort for a
// host with the memory to spare, not a CPU device.
func CPUFallback(on bool) Option { return optFunc(func(c *cfg) { c.cpuFallback = &on }) }

// fallsBackToCPU reports whether a batch no GPU can take opens a CPU
// engine (CPUFallback).
func (c *cfg) fallsBackToCPU() bool {
	if c.cpuFallback != nil {
		return *c.cpuFallback
	}
	return c.mode == ModeAuto
}

// withAdmissionBackoff is how long a GPU worker waits after its device refused
// a batch, or before pulling while the device is hot (default 20ms), so
// other devices get the first chance at the work.
func withAdmissionBackoff(d time.Duration) Option {
	return optFunc(func(c *cfg) { c.admissionBackoff = d })
}

// withBusyInterval sets how often the busy sampler reads utilization, so
// a test need not wait 250 ms per reading.
func withBusyInterval(d time.Duration) Option { return optFunc(func(c *cfg) { c.busyInterval = d }) }

// withUtilizationHysteresis sets when a GPU counts as hot: utilization at or
// above hot (default 95), or a power/thermal throttle reason, makes it hot;
// it cools only below cool (default 80) with no throttling. A hot device
// waits before pulling and admits only half-budget batches, so it takes a
// smaller share; two thresholds keep it from flapping.
func withUtilizationHysteresis(cool, hot uint32) Option {
	return optFunc(func(c *cfg) { c.coolUtilization, c.hotUtilization = cool, hot })
}

// withAfterCUDAInit runs fn once New has created and calibrated the CUDA
// sessions (not when no CUDA engine was attempted). Background: the CUDA
// execution provider can replace Go's SIGINT/SIGTERM handlers with ones
// lacking SA_ONSTACK (onnxruntime_go issue #140); Ctrl+C then crashes the
// runtime and signal.NotifyContext never fires. Calling signal.Notify again
// does not help, because the Go runtime believes its handler is still
// installed. So the pool itself saves the SIGINT/SIGTERM sigactions before
// the first CUDA call, restores them after the sessions are created and
// calibrated, and checks them (restoring any that changed) after every GPU
// run. fn is the hook for anything cmd/scorer must redo at that point
// (handlers for other signals it owns, or a check that shutdown signals
// still arrive).
func withAfterCUDAInit(fn func()) Option { return optFunc(func(c *cfg) { c.afterCUDAInit = fn }) }

// MemLimit is this process's share of each GPU's memory: Bytes, or a
// Fraction of the device's total; the zero value means no per-process
// limit (MemFraction alone bounds the device).
type MemLimit struct {
	Bytes    uint64
	Fraction float64
}

// ParseMemLimit reads GPU_MEM_LIMIT: "" or "0" for none, a fraction of the
// device in (0, 1] ("0.45"), or bytes with an optional binary or decimal
// unit ("12GiB", "12G", "12884901888").
func ParseMemLimit(s string) (MemLimit, error) {
	s = strings.TrimSpace(s)
	if s == "" || s == "0" {
		return MemLimit{}, nil
	}
	if strings.Contains(s, ".") && strings.Trim(s, "0123456789.") == "" {
		f, err := strconv.ParseFloat(s, 64)
		if err != nil || !(f > 0 && f <= 1) {
			return MemLimit{}, fmt.Errorf("gpupool: GPU memory limit %q: a fraction must be in (0, 1]", s)
		}
		return MemLimit{Fraction: f}, nil
	}
	num := strings.TrimRight(s, "KMGTiBkmgtb")
	unit := strings.ToUpper(strings.TrimSpace(s[len(num):]))
	mult := map[string]uint64{"": 1, "B": 1, "K": 1e3, "KB": 1e3, "M": 1e6, "MB": 1e6, "G": 1e9, "GB": 1e9, "T": 1e12, "TB": 1e12,
		"KI": 1 << 10, "KIB": 1 << 10, "MI": 1 << 20, "MIB": 1 << 20, "GI": 1 << 30, "GIB": 1 << 30, "TI": 1 << 40, "TIB": 1 << 40}[unit]
	n, err := strconv.ParseUint(strings.TrimSpace(num), 10, 64)
	if err != nil || mult == 0 || n == 0 {
		return MemLimit{}, fmt.Errorf("gpupool: GPU memory limit %q: want bytes (12GiB, 12884901888) or a fraction (0.45)", s)
	}
	return MemLimit{Bytes: n * mult}, nil
}

func (m MemLimit) validate() error {
	if m.Bytes > 0 && m.Fraction > 0 {
		return errors.New("MemLimit: both Bytes and Fraction set")
	}
	if m.Fraction < 0 || m.Fraction > 1 {
		return fmt.Errorf("MemLimit fraction %v not in [0, 1]", m.Fraction)
	}
	return nil
}

// Of is the limit on a device of total bytes; 0 means none.
func (m MemLimit) Of(total uint64) uint64 {
	if m.Bytes > 0 {
		return m.Bytes
	}
	return uint64(m.Fraction * float64(total))
}

// String prints the limit as configured.
func (m MemLimit) String() string {
	switch {
	case m.Bytes > 0:
		return strconv.FormatUint(m.Bytes, 10)
	case m.Fraction > 0:
		return strconv.FormatFloat(m.Fraction, 'g', -1, 64)
	}
	return "0"
}

// GPUMemLimit sets this process's memory budget on each GPU (default none):
// admission keeps our weights, arena and running batches within it, as well
// as within MemFraction of the device and its free memory, so two scorers
// sharing a GPU each stay in their share. SessionFactory callers pass the
// same value as SessionConfig.GPUMemBudget, which caps ORT's arena under it.
func GPUMemLimit(l MemLimit) Option { return optFunc(func(c *cfg) { c.memLimit = l }) }

// Probation is how long a degraded GPU rests before the pool tries it again
// with a one-pair batch (default 5m); on success it takes work again. A lost
// GPU (NVML says so) is re-probed the same way, and stays out while NVML
// still reports it lost.
func Probation(d time.Duration) Option { return optFunc(func(c *cfg) { c.probation = d }) }
