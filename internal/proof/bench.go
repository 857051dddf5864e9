// Package proof is `scorer gpu-proof`: the measurements `make gpu-proof`
// (scripts/gpu-proof.sh) takes on a GPU host and the report it writes. Each
// measuring subcommand runs in its own process, so one model's device
// memory never shows in another's numbers:
//
//	scorer gpu-proof bench   one model on GPU 0: pairs/s and device memory at
//	                         batch shapes across lengths, the calibrated
//	                         memory model against the measured peaks, and
//	                         the memory CUDA takes beside ORT's arena
//	scorer gpu-proof share   one scorer of several sharing a GPU: real
//	                         transcripts through the service's pool
//	scorer gpu-proof report  the JSON and Markdown report from a results
//	                         folder (doctor, compare, bench and share files)
//
// docs/gpu.md says how to run it and read the report. Nothing here runs
// without a GPU: each subcommand fails at once with the doctor's cause.
package proof

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/rs/zerolog"

	"github.com/scorer/scorer/gpupool"
	"github.com/scorer/scorer/internal/cli"
	"github.com/scorer/scorer/internal/config"
	"github.com/scorer/scorer/internal/measure"
	"github.com/scorer/scorer/internal/scoring"
	"github.com/scorer/scorer/model"
	"github.com/scorer/scorer/model/ortenv"
)

// Spec is `scorer gpu-proof` for its help and the docs.
var Spec = cli.Spec{
	Name: "gpu-proof", Synopsis: "bench|share|report [flags]",
	Summary: "the GPU measurements of make gpu-proof: bench, share, report (docs/gpu.md)",
	About: "The measurements `make gpu-proof` (scripts/gpu-proof.sh) takes on a GPU host, each in its own " +
		"process, and the report it writes (docs/gpu.md). Without a GPU each measuring subcommand stops at once " +
		"with the doctor's cause.",
	Settings: config.Set{Command: "gpu-proof"},
	Sub:      []cli.Spec{benchSpec, shareSpec, reportSpec},
}

var (
	benchSpec = cli.Spec{
		Name: "gpu-proof bench", Synopsis: "--out FILE [flags]",
		Summary:  "one model on GPU 0: pairs/s and device memory at batch shapes across lengths, the calibrated memory model against the measured peaks",
		Settings: config.GPUProof, Flags: func(fs *flag.FlagSet) { new(benchFlags).register(fs) },
	}
	shareSpec = cli.Spec{
		Name: "gpu-proof share", Synopsis: "--in FILE --out FILE [flags]",
		Summary:  "one scorer of several sharing a GPU: real transcripts through the service's pool, with its OOM retries, refusals and the device's peak",
		Settings: config.GPUProof, Flags: func(fs *flag.FlagSet) { new(shareFlags).register(fs) },
	}
	reportSpec = cli.Spec{
		Name: "gpu-proof report", Synopsis: "--dir DIR [flags]",
		Summary:  "the JSON and Markdown report from a results folder (doctor, compare, bench and share files)",
		Settings: config.Set{Command: "gpu-proof report"}, Flags: func(fs *flag.FlagSet) { new(reportFlags).register(fs) },
	}
)

// Command dispatches `scorer gpu-proof <bench|share|report>`.
func Command(ctx context.Context, e cli.Env, args []string) error {
	if len(args) == 1 && (args[0] == "-h" || args[0] == "--help" || args[0] == "help") {
		Spec.Help(e.Stderr)
		return cli.ErrUsage
	}
	if len(args) == 0 {
		return cli.UsageError{Msg: "gpu-proof: want a subcommand: bench, share or report (see docs/gpu.md)"}
	}
	switch args[0] {
	case "bench":
		return benchCommand(ctx, e, args[1:])
	case "share":
		return shareCommand(ctx, e, args[1:])
	case "report":
		return reportCommand(e, args[1:])
	}
	return cli.UsageError{Msg: fmt.Sprintf("gpu-proof: unknown subcommand %q (bench, share or report)", args[0])}
}

// Shape is one measured batch shape.
type Shape struct {
	Rows int `json:"rows"`
	Len  int `json:"len"`
	// PairsPerSecond and MsPerBatch are the timed runs' throughput and
	// median batch time.
	PairsPerSecond float64 `json:"pairs_per_second"`
	MsPerBatch     float64 `json:"ms_per_batch"`
	// PeakBytes is this process's device memory after the shape's runs
	// (ORT's arena keeps its high-water mark until released), ActivationBytes
	// that less the idle footprint, PredictedBytes what the pool's admission
	// reserves for the shape (gpupool.MemoryModel.Bytes: the
	// calibrated model, intercept and margins included). Files from before
	// 2026-11-27 have the model's slopes only there.
	PeakBytes       uint64  `json:"peak_bytes"`
	ActivationBytes uint64  `json:"activation_bytes"`
	PredictedBytes  float64 `json:"predicted_activation_bytes"`
	// TFLOPS is the model's useful arithmetic per second at this shape
	// (FLOPsPerPair), and PeakShare that against the GPU's dense fp16 peak.
	TFLOPS    float64 `json:"tflops"`
	PeakShare float64 `json:"fp16_peak_share,omitempty"`
	// GPUBusy is NVML's utilization over the shape's timed runs (the
	// share of time a kernel ran); absent where NVML cannot read it. Below
	// 1 at a fixed shape is host time between runs: binding, copies.
	GPUBusy *float64 `json:"gpu_busy_ratio,omitempty"`
	OOM     bool     `json:"oom,omitempty"`
	Error   string   `json:"error,omitempty"`
}

// Bench is one model's measurements on one GPU.
type Bench struct {
	Model     string `json:"model"`
	File      string `json:"file"`
	SHA256    string `json:"sha256"`
	Precision string `json:"precision"` // fp32 or fp16 (the logits' type)
	TF32      bool   `json:"tf32"`
	GPU       string `json:"gpu"`
	GPUMemory uint64 `json:"gpu_memory_bytes"`
	// FP16PeakTFLOPS is the GPU's dense fp16 tensor-core peak from its name
	// (0 when the name is not in the table).
	FP16PeakTFLOPS float64 `json:"fp16_peak_tflops"`
	// Params and FLOPsPerToken describe the model's arithmetic: 2 FLOPs
	// per weight per token (embeddings excluded) plus attention, which
	// grows with the length and is added per shape.
	Params int64 `json:"params"`
	// MemoryReading says whose memory the byte counts are: "process" (NVML
	// lists this process) or "device" (device-wide used memory).
	MemoryReading string `json:"memory_reading"`
	// IdleBytes is this process's device memory with the session open after
	// one tiny run and an emptied arena: the CUDA context, cuBLAS/cuDNN
	// workspaces and the weights. WeightBytes is the graph's initializers
	// (file size), NonArenaBytes their difference: what admission must
	// count beside the weights and the arena. MarginBytes is what the
	// pool's admission does count there (its engine's opening footprint
	// and the memory beside the arena, less WeightBytes), MarginMeasured
	// whether that was measured after its workers ran (else the
	// gpupool.DefaultGPUMemMargin floor; before 2026-11-27, always that
	// constant).
	IdleBytes      uint64 `json:"idle_bytes"`
	WeightBytes    uint64 `json:"weight_bytes"`
	NonArenaBytes  int64  `json:"non_arena_bytes"`
	MarginBytes    uint64 `json:"margin_bytes"`
	MarginMeasured bool   `json:"margin_measured,omitempty"`
	// Calibrated is the pool's fitted memory model on this GPU, HeldOut its
	// margin for shapes it was not fitted on.
	Calibrated struct {
		Base, PerRow, PerToken, PerTokenLen, HeldOut float64
		Error                                        string `json:",omitempty"`
	} `json:"calibrated"`
	// MaxRelError is the largest |predicted − measured| / measured over the
	// shapes with at least 64 MiB of activations, MaxUnder the largest
	// (measured − predicted) / measured (0: never under), UnderAt where.
	MaxRelError float64 `json:"calibration_max_rel_error"`
	MaxUnder    float64 `json:"calibration_max_under"`
	UnderAt     string  `json:"calibration_under_at,omitempty"`
	Shapes      []Shape `json:"shapes"`
}

// benchFlags are `scorer gpu-proof bench`'s own flags.
type benchFlags struct {
	out, lengths, budgets string
	maxRows               int
	seconds               time.Duration
}

func (f *benchFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.out, "out", "", "write the JSON result here (required)")
	fs.StringVar(&f.lengths, "lengths", "32,48,64,128,256,512", "pair lengths to measure, in tokens")
	fs.StringVar(&f.budgets, "tokens", "8192,32768,131072", "rows × length budgets per batch; rows = budget / length")
	fs.IntVar(&f.maxRows, "max-rows", 2048, "cap on rows per batch")
	fs.DurationVar(&f.seconds, "time", 2*time.Second, "timed runs per shape")
}

func benchCommand(ctx context.Context, e cli.Env, args []string) error {
	fs := benchSpec.FlagSet(e)
	var f benchFlags
	f.register(fs)
	cfg, err := benchSpec.Load(e, fs, args)
	if err != nil {
		return err
	}
	if f.out == "" {
		return cli.UsageError{Msg: "gpu-proof bench: --out is required"}
	}
	lens, err1 := ints(f.lengths)
	toks, err2 := ints(f.budgets)
	if err := errors.Join(err1, err2); err != nil {
		return cli.UsageError{Msg: "gpu-proof bench: " + err.Error()}
	}
	guard, err := ortenv.SaveSignals()
	if err != nil {
		return err
	}
	defer guard.RestoreChanged()
	m, probe, rt, err := open(ctx, cfg)
	if err != nil {
		return err
	}
	defer rt.Close()
	devs, err := probe.Devices()
	if err != nil {
		return fmt.Errorf("gpu-proof: %w", err)
	}
	d := devs[0]
	b := Bench{Model: m.Name, File: m.ONNXPath, SHA256: m.SHA256, Precision: "fp32", TF32: cfg.GPUTF32,
		GPU: d.Name, GPUMemory: d.TotalMemory, FP16PeakTFLOPS: fp16Peak(d.Name), MarginBytes: gpupool.DefaultGPUMemMargin}
	if m.OutputType.String() == "ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16" || strings.Contains(m.ONNXPath, "fp16") {
		b.Precision = "fp16"
	}
	shape, err := readShape(m.Dir)
	if err != nil {
		return fmt.Errorf("gpu-proof: %s: %w", m.Dir, err)
	}
	b.Params = shape.params()
	for _, f := range m.Files() {
		if st, err := os.Stat(f); err == nil {
			b.WeightBytes += uint64(st.Size())
		}
	}
	mem := memReader(probe, d.Index, &b.MemoryReading)

	// The configured sessions and pool, allowed 0.95 of the GPU and no
	// per-process budget: the shapes probe how far memory goes, not what a
	// tenant may take.
	wide := cfg
	wide.GPUMemFraction, wide.GPUMemLimit = 0.95, "0"
	scfg := wide.SessionConfig(config.DetectHost())
	dev := gpupool.Device{Kind: gpupool.CUDA, Index: d.Index, UUID: d.UUID, Name: d.Name, TotalMemory: d.TotalMemory}
	eng, err := gpupool.SessionFactory(m, scfg)(dev)
	guard.RestoreChanged()
	if err != nil {
		return fmt.Errorf("gpu-proof: %w", err)
	}
	s := eng.(*model.Session)
	run := func(rows, length int) error {
		_, err := s.ScorePairs(ctx, synthetic(rows, length))
		return err
	}
	if err := run(1, 8); err != nil {
		return fmt.Errorf("gpu-proof: first run: %w", err)
	}
	if err := s.ReleaseArena(ctx); err != nil {
		return fmt.Errorf("gpu-proof: %w", err)
	}
	b.IdleBytes = mem()
	b.NonArenaBytes = int64(b.IdleBytes) - int64(b.WeightBytes)

	seen := map[[2]int]bool{}
	for _, l := range lens {
		if l > m.MaxLength {
			continue
		}
		for _, t := range toks {
			rows := max(1, min(f.maxRows, t/l))
			if seen[[2]int{rows, l}] {
				continue
			}
			seen[[2]int{rows, l}] = true
			sh := Shape{Rows: rows, Len: l}
			if err := s.ReleaseArena(ctx); err != nil {
				return fmt.Errorf("gpu-proof: %w", err)
			}
			stopBusy := gpupool.MeasureBusy(probe, dev, 0)
			sh.PairsPerSecond, sh.MsPerBatch, err = timeShape(ctx, run, rows, l, f.seconds)
			if r, ok := stopBusy().Ratio(); ok {
				sh.GPUBusy = &r
			}
			guard.RestoreChanged()
			if err != nil {
				sh.OOM = errors.Is(err, model.ErrOutOfMemory)
				sh.Error = err.Error()
			} else {
				sh.PeakBytes = mem()
				sh.ActivationBytes = sh.PeakBytes - min(sh.PeakBytes, b.IdleBytes)
				sh.TFLOPS = sh.PairsPerSecond * shape.flopsPerPair(l) / 1e12
				if b.FP16PeakTFLOPS > 0 {
					sh.PeakShare = sh.TFLOPS / b.FP16PeakTFLOPS
				}
			}
			busy := "busy n/a"
			if sh.GPUBusy != nil {
				busy = fmt.Sprintf("busy %3.0f%%", 100**sh.GPUBusy)
			}
			fmt.Fprintf(e.Stderr, "gpu-proof bench %s: %4d×%-3d %8.0f pairs/s %7.1f ms/batch %6.0f MiB %s\n", m.Name, rows, l, sh.PairsPerSecond, sh.MsPerBatch, float64(sh.PeakBytes)/(1<<20), busy)
			b.Shapes = append(b.Shapes, sh)
		}
	}
	_ = s.ReleaseArena(ctx)

	// The service's own calibration on the same GPU, against the shapes.
	stack, err := scoring.Open(ctx, wide, zerolog.Nop(), nil, scoring.OnRuntime(rt), scoring.WithModel(m), scoring.OneGPU(d.UUID), scoring.NoCache())
	guard.RestoreChanged()
	if err != nil {
		b.Calibrated.Error = err.Error()
	} else {
		st := stack.Pool.Stats().Devices[0]
		c := &b.Calibrated
		mm := st.Memory
		c.Base, c.PerRow, c.PerToken, c.PerTokenLen, c.HeldOut = mm.Base, mm.PerRow, mm.PerToken, mm.PerTokenLen, mm.HeldOut
		b.MarginBytes = uint64(max(0, float64(mm.WeightBytes)+mm.BesideArenaBytes-float64(b.WeightBytes)))
		b.MarginMeasured = mm.BesideArenaMeasured
		_ = stack.Close(context.Background())
		for i := range b.Shapes {
			b.Shapes[i].PredictedBytes = mm.Bytes(b.Shapes[i].Rows, b.Shapes[i].Len)
		}
		b.compareMemory()
	}
	_ = s.Close()
	return writeJSON(f.out, b)
}

// compareMemory sets MaxRelError, MaxUnder and UnderAt from the shapes
// with at least 64 MiB of activations (smaller ones are within the
// readings' noise).
func (b *Bench) compareMemory() {
	b.MaxRelError, b.MaxUnder, b.UnderAt = 0, 0, ""
	for _, sh := range b.Shapes {
		if sh.Error != "" || sh.ActivationBytes < 64<<20 {
			continue
		}
		act := float64(sh.ActivationBytes)
		b.MaxRelError = math.Max(b.MaxRelError, math.Abs(sh.PredictedBytes-act)/act)
		if under := (act - sh.PredictedBytes) / act; under > b.MaxUnder {
			b.MaxUnder, b.UnderAt = under, fmt.Sprintf("%d×%d", sh.Rows, sh.Len)
		}
	}
}

// timeShape runs one warm-up batch, then batches for d, and returns pairs/s
// and the median batch time in ms.
func timeShape(ctx context.Context, run func(rows, length int) error, rows, length int, d time.Duration) (float64, float64, error) {
	if err := run(rows, length); err != nil {
		return 0, 0, err
	}
	calls, elapsed, err := measure.Repeat(ctx, d, 3, func(context.Context) error { return run(rows, length) })
	if err == nil {
		err = ctx.Err()
	}
	if err != nil {
		return 0, 0, err
	}
	times := make([]float64, len(calls))
	for i, c := range calls {
		times[i] = float64(c.Microseconds()) / 1000
	}
	slices.Sort(times)
	return float64(rows*len(times)) / elapsed.Seconds(), times[len(times)/2], nil
}

// synthetic is rows pairs of length tokens: memory and time depend on the
// shape, not the ids (id 5 is in every vocabulary).
func synthetic(rows, length int) []model.Pair {
	ids := make([]int32, length)
	types := make([]int32, length)
	for i := range ids {
		ids[i] = 5
	}
	pairs := make([]model.Pair, rows)
	for i := range pairs {
		pairs[i] = model.Pair{IDs: ids, TypeIDs: types}
	}
	return pairs
}

func ints(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("%q is not a list of positive integers", s)
		}
		out = append(out, n)
	}
	return out, nil
}

func writeJSON(path string, v any) error {
	data, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(path, append(data, '\n'), 0o644); err != nil {
		return fmt.Errorf("gpu-proof: %w", err)
	}
	return nil
}
