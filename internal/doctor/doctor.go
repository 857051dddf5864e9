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
	"fmt"
	"slices"
	"time"

	"github.com/rs/zerolog"

	"github.com/scorer/scorer/gpupool"
	"github.com/scorer/scorer/internal/config"
	"github.com/scorer/scorer/internal/scoring"
	"github.com/scorer/scorer/model"
	"github.com/scorer/scorer/model/ortenv"
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
	guard, err := ortenv.SaveSignals()
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
	info, err := ortenv.ProbeRuntime(o.ORTLib)
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
		rep.CUDALibs = ortenv.FindCUDALibraries()
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
