// Package doctor is `scorer doctor`: the check a user runs on their own host
// to see whether, and how well, the configured DEVICE works there. No CI
// machine of this project has a GPU, so the GPU path is proven on the CPU
// only as far as physics allows (the packaging and memory-model tests); this
// report is what shows it on real hardware: ONNX Runtime's providers, the
// driver and its GPUs (MIG included) as CUDA will number them, a CUDA session
// per GPU, CPU-vs-GPU parity on a sample, the calibrated memory model, a
// short throughput run, and the settings it recommends. Without a GPU it
// reports the CPU path and why there is no GPU. docs/gpu.md explains every
// line.
package doctor

import (
	"context"
	"errors"
	"fmt"
	"math"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/rs/zerolog"
	ort "github.com/yalue/onnxruntime_go"

	"github.com/scorer/scorer/gpupool"
	"github.com/scorer/scorer/gpupool/hostcheck"
	"github.com/scorer/scorer/internal/config"
	"github.com/scorer/scorer/internal/measure"
	"github.com/scorer/scorer/internal/scoring"
	"github.com/scorer/scorer/model"
)

// Options is what the doctor checks: the service's own configuration, from
// which it builds its scorers as the service does (package config), with
// its own overrides only where a check needs them.
type Options struct {
	// Config is the configuration under test: DEVICE, the model, labels,
	// batch shapes, CPU plan and memory, GPU settings.
	Config config.Config
	// ORTLib is the ONNX Runtime core library, resolved (Config.ORTLib may
	// be relative).
	ORTLib string
	// Duration is each throughput run's length at most (default 3s).
	Duration time.Duration
	// Budget is the wall-clock time the doctor aims to answer in (default
	// DefaultBudget). What proves the configured path works always runs:
	// loading the model, opening each device's pool (the GPU's calibration
	// included) and scoring the sample's first pair on it. The rest of the
	// sample, the CPU reference for parity when a GPU is the path, the TF32
	// comparison and the throughput runs take what is left, each sized by
	// the time the pairs before it took; Report.Skipped says what was cut
	// and why. On production-size DeBERTa-v3 in fp16 the CPU takes about a
	// second a pair on 2 cores, so the whole sample alone would take 30 s.
	Budget time.Duration
	// LookupEnv reads CUDA_VISIBLE_DEVICES and CUDA_DEVICE_ORDER (default:
	// none set).
	LookupEnv func(string) (string, bool)
	// Log receives the pools' own logs (default: none).
	Log zerolog.Logger
}

// device is the configured DEVICE; "" reads as auto, as the service
// reads it.
func (o Options) device() gpupool.DeviceMode {
	d, err := gpupool.ParseDeviceMode(o.Config.Device)
	if err != nil {
		return gpupool.ModeAuto
	}
	return d
}

// Problem is a diagnosed failure: one line of cause, one of remedy.
type Problem struct {
	Kind   string `json:"kind,omitempty"`
	Cause  string `json:"cause"`
	Remedy string `json:"remedy,omitempty"`
	Error  string `json:"error,omitempty"`
}

func problemOf(err error) *Problem {
	if err == nil {
		return nil
	}
	if p, ok := hostcheck.DiagnoseCUDA(err); ok {
		return &Problem{Kind: p.Kind, Cause: p.Cause, Remedy: p.Remedy, Error: err.Error()}
	}
	return &Problem{Cause: firstLine(err.Error()), Error: err.Error()}
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(s, "\n")
	return s
}

// Report is the doctor's finding; JSON field names are stable.
type Report struct {
	// Device is the configured DEVICE, OK whether it works as configured
	// here, and Path where scoring would run: "cuda" or "cpu".
	Device string `json:"device"`
	OK     bool   `json:"ok"`
	Path   string `json:"path"`
	// Verdict is one line; Problem is why not OK (or, when OK on the CPU
	// under auto, why there is no GPU).
	Verdict string   `json:"verdict"`
	Problem *Problem `json:"problem,omitempty"`

	ORT ORTReport `json:"onnxruntime"`
	// CUDALibs is where the dynamic loader finds each CUDA library the
	// CUDA path needs (hostcheck.CUDALibraries), cuDNN included: the
	// provider opens cuDNN only at a first run, so a session that opens
	// does not prove it is there. Not checked for DEVICE=cpu.
	CUDALibs []hostcheck.LibraryLocation `json:"cuda_libraries,omitempty"`
	// SignalsRestored counts the signal handlers that loading CUDA replaced
	// and the doctor put back (gpupool.SaveSignals, taken before anything
	// touched CUDA); nonzero shows why the guard exists.
	SignalsRestored int `json:"signal_handlers_restored"`

	NVML      NVMLReport       `json:"nvml"`
	CPU       *DeviceCheck     `json:"cpu,omitempty"`
	GPUs      []DeviceCheck    `json:"gpus,omitempty"`
	Recommend Recommendation   `json:"recommend"`
	Sample    SampleDescriptor `json:"sample"`
	// Skipped lists what the budget or the graph left out, each with why;
	// Seconds is how long the doctor took, Budget what it aimed for.
	Skipped []string `json:"skipped,omitempty"`
	Seconds float64  `json:"seconds"`
	Budget  float64  `json:"budget_seconds"`
}

// DefaultBudget is Options.Budget's default: within it, on 2 cores with
// production-size DeBERTa-v3 in fp16 the doctor scores a few of the
// sample's 36 pairs on the CPU and skips the throughput run.
const DefaultBudget = 15 * time.Second

// ORTReport is what the ONNX Runtime library offers.
type ORTReport struct {
	Library   string   `json:"library"`
	Version   string   `json:"version"`
	Providers []string `json:"providers"`
	// CUDA is nil when the CUDA provider loads with its libraries, the
	// CUDA runtime and the driver; else why not.
	CUDA *Problem `json:"cuda_problem,omitempty"`
}

// NVMLReport is what the driver says.
type NVMLReport struct {
	Available         bool     `json:"available"`
	Problem           *Problem `json:"problem,omitempty"`
	DriverVersion     string   `json:"driver_version,omitempty"`
	CUDADriverVersion int      `json:"cuda_driver_version,omitempty"`
	// CUDAVisibleDevices and CUDADeviceOrder are the variables as set
	// ("(unset)" otherwise); GPUs lists the devices CUDA will see, each
	// under its CUDA ordinal with the NVML index it maps to.
	CUDAVisibleDevices string    `json:"cuda_visible_devices"`
	CUDADeviceOrder    string    `json:"cuda_device_order"`
	GPUs               []GPUInfo `json:"gpus,omitempty"`
	Warnings           []string  `json:"warnings,omitempty"`
}

// GPUInfo is one GPU (or MIG instance) as CUDA will number it.
type GPUInfo struct {
	CUDAIndex   int    `json:"cuda_index"`
	NVMLIndex   int    `json:"nvml_index"`
	UUID        string `json:"uuid"`
	Name        string `json:"name"`
	TotalMemory uint64 `json:"total_memory_bytes"`
	PCIBusID    string `json:"pci_bus_id,omitempty"`
	MIG         bool   `json:"mig,omitempty"`
}

// DeviceCheck is one device's session, parity, memory model and speed.
type DeviceCheck struct {
	Device  string   `json:"device"`
	UUID    string   `json:"uuid,omitempty"`
	OK      bool     `json:"ok"`
	Problem *Problem `json:"problem,omitempty"`
	// Skipped is why this device was not checked at all (the CPU as a
	// parity reference, when the budget was spent on the GPUs).
	Skipped string `json:"skipped,omitempty"`
	// SamplePairs is how many of the sample's pairs this device scored
	// (all of them unless the budget cut it); parity is over the pairs
	// both devices scored.
	SamplePairs int `json:"sample_pairs"`
	// MaxAbsDelta is the largest |p_gpu − p_cpu| over the sample and
	// Agreement the share of pairs on the same side of THRESHOLD (GPU
	// only); TF32MaxAbsDelta is the same delta with TF32 on (or off, when
	// GPU_TF32 is on): what the setting costs in fidelity.
	MaxAbsDelta     *float64 `json:"max_abs_delta,omitempty"`
	Agreement       *float64 `json:"agreement,omitempty"`
	TF32MaxAbsDelta *float64 `json:"tf32_max_abs_delta,omitempty"`
	// Memory is the calibrated model (GPU only).
	Memory *MemoryModel `json:"memory,omitempty"`
	// MaxBatchTokens and MaxBatchRows are the batch caps the pool planned
	// under, Workers its workers on this device and IntraOpThreads each
	// CPU worker's threads: the service's own, from the same settings.
	MaxBatchTokens int `json:"max_batch_tokens,omitempty"`
	MaxBatchRows   int `json:"max_batch_rows,omitempty"`
	Workers        int `json:"workers,omitempty"`
	IntraOpThreads int `json:"intra_op_threads,omitempty"`
	// PairsPerSecond is the throughput of the short run, with its batch
	// shapes.
	PairsPerSecond float64 `json:"pairs_per_second"`
	Batches        uint64  `json:"batches"`
	MeanBatchRows  float64 `json:"mean_batch_rows"`
	Padding        float64 `json:"padding_efficiency"`

	// scores and tf32Scores are the sample's scores, for parity with the
	// CPU's once it has run; opening is how long opening its pool took.
	scores, tf32Scores []float32
	opening            time.Duration
}

// MemoryModel is the pool's gpupool.MemoryModel as the report shows it: the
// calibrated bytes ≈ base + perRow·rows + perToken·rows·len +
// perTokenLen·rows·len² with the fit's held-out error, what admission
// counts beside the weights and the arena, the arena cap, and how many rows
// of the model's longest pairs the planner lets one batch have on an
// otherwise idle GPU (MaxRows in the model's Room of its budget).
type MemoryModel struct {
	BaseBytes           float64 `json:"base_bytes"`
	PerRowBytes         float64 `json:"per_row_bytes"`
	PerTokenBytes       float64 `json:"per_token_bytes"`
	PerTokenLenBytes    float64 `json:"per_token_len_bytes"`
	HeldOutError        float64 `json:"held_out_error"`
	WeightBytes         uint64  `json:"weight_bytes"`
	BesideArenaBytes    float64 `json:"beside_arena_bytes"`
	BesideArenaMeasured bool    `json:"beside_arena_measured"`
	ArenaLimitBytes     uint64  `json:"arena_limit_bytes"`
	MaxRowsAtModelMax   int     `json:"max_rows_at_max_length"`
}

// Recommendation is the settings the doctor suggests for this host.
type Recommendation struct {
	Device         string `json:"DEVICE"`
	MaxBatchTokens int    `json:"MAX_BATCH_TOKENS"`
	Workers        int    `json:"WORKERS"`
	CPUThreads     int    `json:"CPU_THREADS,omitempty"`
	GPUMemLimit    string `json:"GPU_MEM_LIMIT"`
	Note           string `json:"note,omitempty"`
}

// SampleDescriptor says what the parity and throughput runs scored.
type SampleDescriptor struct {
	Pairs     int     `json:"pairs"`
	Threshold float64 `json:"threshold"`
	// PairEncoding is PAIR_ENCODING: the sample is encoded as the service
	// would encode it.
	PairEncoding string `json:"pair_encoding"`
}

// sampleSentences are earnings-call sentences of mixed length: short ones,
// and long ones so padding and attention cost show.
var sampleSentences = []string{
	"Consumers pulled back sharply on discretionary purchases this quarter.",
	"Revenue grew 12%.",
	"We saw strong demand across all of our retail channels, with traffic up double digits and average ticket higher than a year ago, which gives us confidence in the outlook.",
	"Thank you.",
	"Inventory levels remain elevated as shoppers trade down to private label and delay big-ticket items, and we expect that pressure to persist through the holiday season and into the first half of next year.",
	"Same-store sales declined 3% as lower-income households cut back on non-essential spending.",
	"Our premium segment continued to outperform, and we are raising full-year guidance.",
	"Promotional activity increased across the industry, compressing gross margin by 150 basis points, while freight and labor costs stayed stubbornly high and the consumer remained cautious about anything beyond everyday needs.",
	"Traffic was flat, but conversion improved.",
	"We are seeing customers stretch their budgets, buy smaller pack sizes and wait for promotions before they commit to larger purchases.",
	"Credit card delinquencies ticked up modestly from last year's historically low levels.",
	"Travel bookings for the summer are running ahead of last year at higher average fares.",
}

// Run checks the host and returns the report. err is only for a doctor
// that could not run at all (ONNX Runtime or the model failing to load);
// a GPU that does not work is a finding, in the report. The GPUs are
// checked before the CPU: on a GPU host they are the point, and the CPU is
// only their parity reference, so the budget goes to them first.
func Run(ctx context.Context, o Options) (Report, error) {
	start := time.Now()
	if o.Duration <= 0 {
		o.Duration = 3 * time.Second
	}
	if o.Budget <= 0 {
		o.Budget = DefaultBudget
	}
	if o.LookupEnv == nil {
		o.LookupEnv = func(string) (string, bool) { return "", false }
	}
	cfg := &o.Config
	rep := Report{Device: string(o.device()), Sample: SampleDescriptor{Threshold: cfg.Threshold}, Budget: o.Budget.Seconds()}
	b := &budget{deadline: start.Add(o.Budget), skipped: &rep.Skipped}

	// Before anything can load CUDA: its libraries may install signal
	// handlers, and Go's must be the ones that stay.
	guard, err := gpupool.SaveSignals()
	if err != nil {
		return rep, fmt.Errorf("doctor: %w", err)
	}
	restore := func() {
		if n, err := guard.RestoreChanged(); err == nil {
			rep.SignalsRestored += n
		}
	}
	defer restore()

	rep.ORT.Library = o.ORTLib
	info, err := model.ProbeRuntime(o.ORTLib)
	if err != nil {
		return rep, err
	}
	rep.ORT.Version, rep.ORT.Providers = info.Version, info.Providers
	// ONNX Runtime and NVML, shared by every pool the doctor opens, whose
	// Close keeps the stacks' rule (nothing unloaded under a live run).
	rt, err := scoring.StartRuntime(o.ORTLib, o.Log)
	if err != nil {
		return rep, err
	}
	defer rt.Close()
	if o.device() != gpupool.ModeCPU {
		rep.CUDALibs = hostcheck.FindCUDALibraries()
	}
	if !info.HasProvider("CUDAExecutionProvider") {
		rep.ORT.CUDA = problemOf(fmt.Errorf("CUDA execution provider is not enabled in this build (%s lists %v)", o.ORTLib, info.Providers))
	} else {
		// CheckCUDA restores any signal handler the provider replaced.
		rep.ORT.CUDA = problemOf(gpupool.CheckCUDA(gpupool.Device{Kind: gpupool.CUDA}, gpupool.SessionConfig{}))
	}

	lo, err := cfg.ModelOptions()
	if err != nil {
		return rep, err
	}
	m, err := model.Load(lo)
	if err != nil {
		return rep, err
	}
	pairs, err := samplePairs(m, o)
	if err != nil {
		return rep, err
	}
	rep.Sample.Pairs, rep.Sample.PairEncoding = len(pairs), string(m.PairEncoding)

	var gpuProblem *Problem
	if o.device() != gpupool.ModeCPU {
		gpuProblem = checkGPUs(ctx, rt, m, o, pairs, b, &rep)
		restore()
		cudnnWarning(&rep)
	}
	gpuOK := slices.ContainsFunc(rep.GPUs, func(c DeviceCheck) bool { return c.OK })
	var opening time.Duration
	for _, g := range rep.GPUs {
		opening = max(opening, g.opening)
	}
	cpu := checkCPU(ctx, rt, m, o, pairs, b, !gpuOK, opening)
	rep.CPU = &cpu
	for i := range rep.GPUs {
		parity(&rep.GPUs[i], cpu.scores, o.Config.Threshold)
	}
	recommend(m, o, &rep)
	verdict(o, &rep, gpuProblem)
	rep.Seconds = time.Since(start).Seconds()
	return rep, nil
}

// budget is what is left of Options.Budget, and where cuts are said.
type budget struct {
	deadline time.Time
	skipped  *[]string
}

func (b *budget) left() time.Duration { return time.Until(b.deadline) }

func (b *budget) skip(format string, args ...any) {
	*b.skipped = append(*b.skipped, fmt.Sprintf(format, args...))
}

// chunkPairs is how many pairs the sample scores at a time: one sentence
// against every label, as a consumer's smallest call would.
func chunkPairs(o Options) int { return max(1, len(o.Config.LabelConfig().Hypotheses())) }

// scoreSample scores the first pair whatever the budget (it is what proves
// the device works), then the rest a chunk at a time, each only while the
// time per pair so far says it ends within the budget's share, left. It
// returns the scores of the pairs it got to and the time per pair.
func scoreSample(ctx context.Context, score func(context.Context, []model.Pair) ([]float32, error), pairs []model.Pair, chunk int,
	left func() time.Duration) ([]float32, time.Duration, error) {
	next := func(done int, elapsed time.Duration) int {
		if done == 0 {
			return 1
		}
		n := min(chunk, len(pairs)-done)
		if elapsed/time.Duration(done)*time.Duration(n) > left() {
			return 0
		}
		return n
	}
	run, err := measure.Chunks(ctx, pairs, next, score)
	if err != nil {
		return run.Results, 0, err
	}
	return run.Results, run.Wall / time.Duration(max(1, len(run.Results))), nil
}

// parity compares a GPU's sample scores (and its TF32 alternative's) with
// the CPU's, over the pairs both scored.
func parity(c *DeviceCheck, cpu []float32, threshold float64) {
	n := min(len(c.scores), len(cpu))
	if !c.OK || n == 0 {
		return
	}
	delta, agree := compare(c.scores[:n], cpu[:n], threshold)
	c.MaxAbsDelta, c.Agreement = &delta, &agree
	if m := min(n, len(c.tf32Scores)); m > 0 {
		d, _ := compare(c.tf32Scores[:m], cpu[:m], threshold)
		c.TF32MaxAbsDelta = &d
	}
}

// cudnnWarning warns when the CUDA provider loads but cuDNN is missing:
// the provider opens cuDNN only when a run first needs it, so the GPU
// check passing does not clear it.
func cudnnWarning(rep *Report) {
	if rep.ORT.CUDA != nil {
		return // the provider's own problem is the cause shown
	}
	for _, l := range rep.CUDALibs {
		if strings.HasPrefix(l.Name, "libcudnn") && l.Path == "" {
			rep.NVML.Warnings = append(rep.NVML.Warnings, fmt.Sprintf("%s not found (%s): the CUDA provider opens cuDNN at the first run that needs it; "+
				"install cuDNN 9 for CUDA 13 (the CUDA image, or pip's nvidia-cudnn-cu13 through the bundle's launcher)", l.Name, l.Error))
		}
	}
}

// samplePairs encodes every sample sentence against every label's
// hypothesis, as the service does (PAIR_ENCODING included).
func samplePairs(m *model.Model, o Options) ([]model.Pair, error) {
	labels := o.Config.LabelConfig()
	var pairs []model.Pair
	for _, s := range sampleSentences {
		for _, h := range labels.Hypotheses() {
			p, err := m.EncodeText(s, h)
			if err != nil {
				return nil, fmt.Errorf("doctor: encoding sample against %q: %w", h, err)
			}
			pairs = append(pairs, p)
		}
	}
	return pairs, nil
}

// checkCPU scores the sample on the CPU pool the service builds with
// DEVICE=cpu (the CPU batch shape, workers and threads, the memory budget:
// scoring.Open from the same configuration) and measures its
// throughput. When a GPU is the path (path false) the CPU is only the
// parity reference: it is skipped when less of the budget is left than
// opening a GPU's pool took (opening, a floor on what opening the CPU's
// costs), and otherwise scores as much of the sample as the budget allows.
func checkCPU(ctx context.Context, rt *scoring.Runtime, m *model.Model, o Options, pairs []model.Pair, b *budget, path bool, opening time.Duration) DeviceCheck {
	c := DeviceCheck{Device: "cpu"}
	if left := b.left(); !path && (left <= 0 || left < opening) {
		c.Skipped = fmt.Sprintf("%.1f s of the %v budget left after the GPU checks; opening a session took %.1f s there", max(0, left.Seconds()), o.Budget, opening.Seconds())
		b.skip("cpu: not run (%s): no parity against the CPU", c.Skipped)
		return c
	}
	cpu := o.Config
	cpu.Device = string(gpupool.ModeCPU)
	host := config.DetectHost()
	mem, _, _ := cpu.CPUMemory(host)
	// Measuring the CPU's memory per batch takes 11 s of production
	// DeBERTa-v3 in fp16 on 2 cores; the service does it at its first start
	// and keeps it (CPU_CALIBRATION_CACHE), the doctor only reads it.
	stack, err := scoring.Open(ctx, cpu, o.Log, nil, scoring.OnRuntime(rt), scoring.WithModel(m), scoring.NoCache(),
		scoring.CPUCalibrationCachedOnly())
	if err != nil {
		c.Problem = problemOf(err)
		return c
	}
	defer stack.Close(context.Background())
	pool := stack.Pool
	if st := pool.Stats(); mem != nil && len(st.Devices) > 0 && st.Devices[0].Memory.BudgetBytes == 0 {
		b.skip("cpu: memory per batch not measured: none kept in CPU_CALIBRATION_CACHE (the service measures and keeps it at its first start); this pool's batches are bounded by rows and tokens only")
	}
	st := pool.Stats()
	c.MaxBatchTokens, c.MaxBatchRows = pool.BatchShape()
	if len(st.Devices) > 0 {
		c.Workers = st.Devices[0].Workers
	}
	_, c.IntraOpThreads = cpu.CPUPlan(host)
	scores, perPair, err := scoreSample(ctx, pool.ScorePairs, pairs, chunkPairs(o), b.left)
	if err != nil {
		c.Problem = problemOf(err)
		return c
	}
	c.OK, c.scores, c.SamplePairs = true, scores, len(scores)
	if len(scores) < len(pairs) {
		b.skip("cpu: scored %d of the sample's %d pairs (%.2f s a pair; the budget had %.1f s left)", len(scores), len(pairs),
			perPair.Seconds(), max(0, b.left().Seconds()))
	}
	throughput(ctx, pool, pairs, chunkPairs(o), o.Duration, perPair, b, &c)
	return c
}

// throughput scores the sample repeatedly for up to d (less when the
// budget has less left) in calls of the size a consumer batch produces (8×
// the sample, fewer pairs when the time per pair says such a call would
// take more than half of d, but never under one chunk), and records pairs/s
// and the batch shapes used. When what is left of the budget cannot hold a
// call of one chunk the run is skipped and the report says so. A call
// still going when the budget ends (or at twice d, if later) is cancelled
// and not counted.
func throughput(ctx context.Context, pool *gpupool.Pool, pairs []model.Pair, chunk int, d, perPair time.Duration, b *budget, c *DeviceCheck) {
	left := b.left()
	d = min(d, left)
	stop := max(2*d, left)
	least := min(chunk, len(pairs))
	if d <= 0 || perPair*time.Duration(least) > left {
		b.skip("%s: throughput run skipped: %.1f s left of the budget, %.2f s a pair", c.Device, max(0, left.Seconds()), perPair.Seconds())
		return
	}
	size := 8 * len(pairs)
	if perPair > 0 {
		// At least one chunk, which the budget holds, even past d.
		size = max(least, min(size, int(d/2/perPair)))
	}
	call := make([]model.Pair, 0, size)
	for len(call) < size {
		call = append(call, pairs[:min(len(pairs), size-len(call))]...)
	}
	run, cancel := context.WithTimeout(ctx, stop)
	defer cancel()
	before := pool.Stats()
	calls, elapsed, err := measure.Repeat(run, d, 0, func(ctx context.Context) error {
		_, err := pool.ScorePairs(ctx, call)
		return err
	})
	// A call the run's time ended mid-way is not counted, and no problem.
	if err != nil && (run.Err() == nil || ctx.Err() != nil) {
		c.OK, c.Problem = false, problemOf(fmt.Errorf("throughput run: %w", err))
		return
	}
	n := len(calls) * len(call)
	if n == 0 {
		b.skip("%s: throughput run: no call of %d pairs ended within %.1f s", c.Device, len(call), stop.Seconds())
		return
	}
	after := pool.Stats()
	c.PairsPerSecond = float64(n) / elapsed.Seconds()
	c.Batches = after.Batches - before.Batches
	if c.Batches > 0 {
		c.MeanBatchRows = float64(after.Pairs-before.Pairs) / float64(c.Batches)
	}
	if pt := after.PaddedTokens - before.PaddedTokens; pt > 0 {
		c.Padding = float64(after.RealTokens-before.RealTokens) / float64(pt)
	}
}

// checkGPUs reads NVML and runs every selected GPU; it returns why no GPU
// works, or nil when at least one does.
func checkGPUs(ctx context.Context, rt *scoring.Runtime, m *model.Model, o Options, pairs []model.Pair, b *budget, rep *Report) *Problem {
	n := &rep.NVML
	n.CUDAVisibleDevices, n.CUDADeviceOrder = envOr(o.LookupEnv, "CUDA_VISIBLE_DEVICES"), envOr(o.LookupEnv, "CUDA_DEVICE_ORDER")
	probe, err := rt.OpenNVML(ctx, o.LookupEnv)
	if err != nil {
		n.Problem = problemOf(err)
		return n.Problem
	}
	n.Available = true
	if sr, ok := probe.(gpupool.SystemReporter); ok {
		if si, err := sr.System(); err == nil {
			n.DriverVersion, n.CUDADriverVersion = si.DriverVersion, si.CUDADriverVersion
		}
	}
	devs, err := probe.Devices()
	if r, ok := probe.(gpupool.DeviceReporter); ok {
		for _, w := range r.DeviceWarnings() {
			n.Warnings = append(n.Warnings, w.Error())
		}
	}
	if err != nil {
		n.Problem = problemOf(err)
		return n.Problem
	}
	for _, d := range devs {
		n.GPUs = append(n.GPUs, GPUInfo{CUDAIndex: d.Index, NVMLIndex: d.NVMLIndex, UUID: d.UUID, Name: d.Name,
			TotalMemory: d.TotalMemory, PCIBusID: d.PCIBusID, MIG: d.MIG})
	}
	if rep.ORT.CUDA != nil {
		// NVML sees GPUs, but ORT cannot drive them: that is the cause.
		return rep.ORT.CUDA
	}
	var first *Problem
	for _, d := range devs {
		if ids := o.Config.GPUIDs; len(ids) > 0 && !selected(ids, d) {
			continue
		}
		c := checkGPU(ctx, rt, m, o, d, pairs, b)
		rep.GPUs = append(rep.GPUs, c)
		if !c.OK && first == nil {
			first = c.Problem
		}
	}
	for _, c := range rep.GPUs {
		if c.OK {
			return nil
		}
	}
	if first == nil {
		first = &Problem{Cause: fmt.Sprintf("GPU_IDS %v selects none of the %d GPUs", o.Config.GPUIDs, len(devs)),
			Remedy: "fix GPU_IDS (CUDA indexes or UUIDs, as listed above)"}
	}
	return first
}

func selected(ids []string, d gpupool.DeviceInfo) bool {
	for _, id := range ids {
		id = strings.TrimSpace(id)
		if id == fmt.Sprint(d.Index) || strings.EqualFold(id, d.UUID) {
			return true
		}
	}
	return false
}

func envOr(lookup func(string) (string, bool), k string) string {
	if v, ok := lookup(k); ok {
		return v
	}
	return "(unset)"
}

// checkGPU opens a calibrated one-GPU pool exactly as the service would,
// scores the sample for parity with the CPU (compared once the CPU has
// run), scores it with TF32 toggled where that changes anything and the
// budget allows, and runs the throughput check.
func checkGPU(ctx context.Context, rt *scoring.Runtime, m *model.Model, o Options, d gpupool.DeviceInfo, pairs []model.Pair, b *budget) DeviceCheck {
	opened := time.Now()
	dev := gpupool.Device{Kind: gpupool.CUDA, Index: d.Index, UUID: d.UUID, Name: d.Name, TotalMemory: d.TotalMemory}
	c := DeviceCheck{Device: dev.Label(), UUID: d.UUID}
	// The service's pool on this one GPU, without the CPU to fall back to,
	// on the Runtime's NVML.
	stack, err := scoring.Open(ctx, o.Config, o.Log, nil, scoring.OnRuntime(rt), scoring.WithModel(m), scoring.OneGPU(d.UUID), scoring.NoCache())
	if err != nil {
		c.Problem = problemOf(err)
		return c
	}
	c.opening = time.Since(opened)
	defer stack.Close(context.Background())
	pool := stack.Pool
	scfg := o.Config.SessionConfig(config.DetectHost())
	c.MaxBatchTokens, c.MaxBatchRows = pool.BatchShape()
	st := pool.Stats().Devices[0]
	c.Workers = st.Workers
	// The pool's own memory model: the budget it admits against and the
	// room it cuts batches to (headroom included), not a recomputation.
	mm := st.Memory
	c.Memory = &MemoryModel{BaseBytes: mm.Base, PerRowBytes: mm.PerRow, PerTokenBytes: mm.PerToken,
		PerTokenLenBytes: mm.PerTokenLen, HeldOutError: mm.HeldOut, WeightBytes: mm.WeightBytes,
		BesideArenaBytes: mm.BesideArenaBytes, BesideArenaMeasured: mm.BesideArenaMeasured, ArenaLimitBytes: gpupool.ArenaLimit(dev, scfg),
		MaxRowsAtModelMax: mm.MaxRows(m.MaxLength, mm.Room(mm.BudgetBytes))}
	// The GPU's share: the CPU reference still has to run after it.
	share := func() time.Duration { return b.left() / 2 }
	scores, perPair, err := scoreSample(ctx, pool.ScorePairs, pairs, chunkPairs(o), share)
	if err != nil {
		c.Problem = problemOf(err)
		return c
	}
	c.OK, c.scores, c.SamplePairs = true, scores, len(scores)
	if len(scores) < len(pairs) {
		b.skip("%s: scored %d of the sample's %d pairs (the budget)", c.Device, len(scores), len(pairs))
	}
	switch took := time.Since(opened); {
	case m.OutputType == ort.TensorElementDataTypeFloat16:
		b.skip("%s: TF32 comparison skipped: an fp16 graph has no float32 products for TF32 to change", c.Device)
	case took > share():
		// Another session costs about what this one did to open and run.
		b.skip("%s: TF32 comparison skipped: a second session would take about %.1f s, the budget has %.1f s", c.Device,
			took.Seconds(), max(0, b.left().Seconds()))
	default:
		alt := scfg
		alt.TF32 = !scfg.TF32
		if eng, err := gpupool.SessionFactory(m, alt)(dev); err == nil {
			// The configured run is the one reported as parity; the other
			// setting's delta is what toggling TF32 would give.
			c.tf32Scores, _ = eng.ScorePairs(ctx, pairs[:len(scores)])
			_ = eng.Close()
		}
	}
	throughput(ctx, pool, pairs, chunkPairs(o), min(o.Duration, share()), perPair, b, &c)
	return c
}

// compare returns the largest |a−b| and the share of pairs on the same
// side of threshold.
func compare(a, b []float32, threshold float64) (maxDelta, agreement float64) {
	t := measure.Tally{Threshold: threshold}
	t.AddAll(a, b)
	return t.MaxAbsDiff, t.Agreement()
}

// recommend suggests settings from what ran.
func recommend(m *model.Model, o Options, rep *Report) {
	r := &rep.Recommend
	r.MaxBatchTokens = o.Config.MaxBatchTokens
	r.GPUMemLimit = o.Config.SessionConfig(config.DetectHost()).GPUMemBudget.String()
	var best *DeviceCheck
	for i := range rep.GPUs {
		if rep.GPUs[i].OK && (best == nil || rep.GPUs[i].PairsPerSecond > best.PairsPerSecond) {
			best = &rep.GPUs[i]
		}
	}
	if best == nil {
		n := runtime.GOMAXPROCS(0)
		r.Device = "cpu"
		r.Workers = min(n, 4)
		r.CPUThreads = max(1, n/r.Workers)
		r.Note = "no usable GPU: DEVICE=cpu skips the GPU probe at start; WORKERS × CPU_THREADS = the cores this process may use"
		if m.OutputType == ort.TensorElementDataTypeFloat16 {
			// Production-size DeBERTa-v3 in fp16: ~0.6 s a pair and ~9 s to
			// open on 2 cores, through the casts ORT puts around each op.
			r.Note += "; this is an fp16 graph, which the CPU runs through casts at a fraction of fp32's speed: on CPU hosts use the fp32 or int8 graph (MODEL_FILE)"
		}
		return
	}
	r.Device = "cuda"
	r.Workers = 2
	if mm := best.Memory; mm != nil && mm.MaxRowsAtModelMax > 0 {
		// The token budget should let a batch of the longest pairs fill the
		// memory the model leaves, no more (the planner caps rows anyway).
		tokens := mm.MaxRowsAtModelMax * m.MaxLength
		r.MaxBatchTokens = max(1024, min(65536, 1<<int(math.Floor(math.Log2(float64(tokens))))))
	}
	r.Note = "DEVICE=cuda fails loudly if the GPU goes missing; GPU_MEM_LIMIT: leave 0 alone on a GPU, else give each scorer its share (e.g. 0.4 for two)"
}

// verdict decides OK for the configured DEVICE and writes the one line.
func verdict(o Options, rep *Report, gpuProblem *Problem) {
	cpuOK := rep.CPU != nil && rep.CPU.OK
	gpuOK := false
	for _, g := range rep.GPUs {
		gpuOK = gpuOK || g.OK
	}
	switch {
	case o.device() == gpupool.ModeCPU:
		rep.Path, rep.OK = "cpu", cpuOK
		if !cpuOK {
			rep.Problem = rep.CPU.Problem
		}
	case gpuOK:
		rep.Path, rep.OK = "cuda", true
	case o.device() == gpupool.ModeCUDA:
		rep.Path, rep.OK, rep.Problem = "none", false, gpuProblem
	default: // auto without a GPU: the CPU path, with the reason
		rep.Path, rep.OK, rep.Problem = "cpu", cpuOK, gpuProblem
		if !cpuOK {
			rep.Problem = rep.CPU.Problem
		}
	}
	if rep.Problem == nil && !rep.OK {
		rep.Problem = &Problem{Cause: "unknown"}
	}
	switch {
	case rep.OK && rep.Path == "cuda":
		rep.Verdict = fmt.Sprintf("OK: DEVICE=%s scores on the GPU here", o.device())
	case rep.OK && o.device() == gpupool.ModeAuto:
		rep.Verdict = "OK: DEVICE=auto scores on the CPU here (no usable GPU: " + rep.Problem.Cause + ")"
	case rep.OK:
		rep.Verdict = "OK: DEVICE=cpu scores on the CPU here"
	default:
		rep.Verdict = fmt.Sprintf("FAIL: DEVICE=%s cannot work here: %s", o.device(), rep.Problem.Cause)
	}
}

// ErrNotOK is what a caller returns when the report's verdict is not OK,
// so the process exits non-zero with the cause.
var ErrNotOK = errors.New("doctor: the configured DEVICE cannot work on this host")
