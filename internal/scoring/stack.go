package scoring

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/scorer/scorer/gpupool"
	"github.com/scorer/scorer/internal/cli"
	"github.com/scorer/scorer/internal/config"
	"github.com/scorer/scorer/model"
	"github.com/scorer/scorer/model/scorecache"
	"github.com/scorer/scorer/schema"
)

// Stack is everything between a decoded event and its scores: the
// ORT runtime, the model, the device pool and the transcript scorer. `run`,
// `score` and `bench` all build the same one.
type Stack struct {
	Model   *model.Model
	Pool    *gpupool.Pool
	Scorer  *model.TranscriptScorer
	Cache   *scorecache.Cache // nil when SCORE_CACHE_BYTES=0
	Labels  model.LabelConfig
	Limits  schema.Limits
	closers []func(context.Context) error
	// poolUnfinished is set when the pool's Close failed: a terminated Run
	// or an NVML call may still be in flight, so NVML and ONNX Runtime
	// must stay loaded (the process is exiting anyway).
	poolUnfinished bool
}

// Open starts the stack in dependency order: ORT environment, model,
// NVML, pool (sessions per device), transcript scorer.
func Open(ctx context.Context, cfg config.Config, log zerolog.Logger, reg prometheus.Registerer) (_ *Stack, err error) {
	s := &Stack{}
	defer func() {
		if err != nil {
			// Undo what was opened; the error is what the caller needs.
			_ = s.Close(context.Background())
		}
	}()
	shutdownORT, err := InitORT(cfg.ORTLib)
	if err != nil {
		return nil, err
	}
	s.closers = append(s.closers, func(context.Context) error {
		if s.poolUnfinished {
			// DestroyEnvironment dlcloses libonnxruntime under any Run
			// still going: a crash instead of an exit.
			log.Warn().Msg("leaving ONNX Runtime loaded: the pool did not finish closing (the process is exiting anyway)")
			return nil
		}
		return shutdownORT()
	})

	m, err := LoadModel(cfg)
	if err != nil {
		return nil, err
	}
	s.Model = m
	log.Info().Str("model", m.Name).Str("sha256", m.SHA256).Strs("inputs", m.InputNames).
		Strs("labels", m.ID2Label).Int("entailment_index", m.EntailmentIndex).Int("max_length", m.MaxLength).
		Str("score_mode", string(m.ScoreMode)).Str("pair_encoding", string(m.PairEncoding)).Msg("model loaded")

	pool, closeNVML, err := NewPool(ctx, cfg, m, log, reg, gpupool.SessionFactory(m, config.SessionConfig(cfg)))
	if err != nil {
		return nil, err
	}
	s.closers = append(s.closers, func(context.Context) error {
		if s.poolUnfinished {
			log.Warn().Msg("leaving NVML initialised: the pool did not finish closing (the process is exiting anyway)")
			return nil
		}
		closeNVML()
		return nil
	})
	s.Pool = pool
	s.closers = append(s.closers, func(ctx context.Context) error {
		err := pool.Close(ctx)
		// ErrCloseIncomplete: a run or NVML call may still be going, and
		// unloading the libraries under it would crash the process. Any
		// other Close error skips the unload too: the process is exiting,
		// so leaving them loaded costs nothing.
		if err != nil {
			s.poolUnfinished = true
			msg := "the device pool closed with an error; skipping NVML and ONNX Runtime shutdown"
			if errors.Is(err, gpupool.ErrCloseIncomplete) {
				msg = "the device pool still has runs going; skipping NVML and ONNX Runtime shutdown (the process is exiting anyway)"
			}
			log.Warn().Err(err).Msg(msg)
		}
		return err
	})

	s.Labels = model.LabelConfig{Template: cfg.HypothesisTemplate, Labels: cfg.Labels, Threshold: cfg.Threshold}
	var scorerOpts []model.ScorerOption
	if cfg.ScoreCacheBytes > 0 {
		if s.Cache, err = scorecache.New(int64(cfg.ScoreCacheBytes), reg); err != nil {
			return nil, err
		}
		scorerOpts = append(scorerOpts, model.WithCache(s.Cache))
	}
	s.Scorer, err = model.NewTranscriptScorer(m, s.Labels, pool, scorerOpts...)
	if err != nil {
		return nil, err
	}
	s.Limits = cfg.Limits()
	return s, nil
}

// LoadModel loads MODEL_DIR with the scoring options from cfg.
func LoadModel(cfg config.Config) (*model.Model, error) {
	lo, err := config.ModelOptions(cfg)
	if err != nil {
		return nil, err
	}
	return model.Load(lo)
}

// NewPool starts NVML (unless DEVICE=cpu) and the device pool over factory.
// The returned func shuts NVML down after the pool is closed. The bench
// passes a factory that records batch shapes; everything else is shared.
func NewPool(ctx context.Context, cfg config.Config, m *model.Model, log zerolog.Logger, reg prometheus.Registerer, factory gpupool.EngineFactory) (*gpupool.Pool, func(), error) {
	devMode, err := gpupool.ParseDeviceMode(cfg.Device)
	if err != nil {
		return nil, nil, err
	}
	memLimit, err := gpupool.ParseMemLimit(cfg.GPUMemLimit)
	if err != nil {
		return nil, nil, fmt.Errorf("GPU_MEM_LIMIT: %w", err)
	}
	opts := []gpupool.Option{
		gpupool.Mode(devMode),
		gpupool.MemFraction(cfg.GPUMemFraction),
		gpupool.GPUMemLimit(memLimit),
		gpupool.Probation(cfg.GPUProbation),
		// Calibration pairs longer than the model's maximum would be
		// rejected, and a rejected calibration drops the GPU.
		gpupool.Calibrate(gpupool.Calibration{MaxLen: m.MaxLength}),
		gpupool.Logger(log.With().Str("component", "gpupool").Logger()),
		gpupool.Registerer(reg),
	}
	if len(cfg.GPUIDs) > 0 {
		opts = append(opts, gpupool.GPUIDs(cfg.GPUIDs...))
	}
	if cfg.Workers > 0 {
		opts = append(opts, gpupool.WorkersPerDevice(cfg.Workers))
	}
	cpuWorkers, _ := config.CPUPlan(cfg)
	opts = append(opts, gpupool.CPUWorkers(cpuWorkers))
	closeNVML := func() {}
	var probe gpupool.Probe
	if devMode != gpupool.ModeCPU {
		PCIBusOrder(log)
		// The CUDA runtime reads CUDA_VISIBLE_DEVICES from the real process
		// environment, so the probe must too, to number GPUs as CUDA does.
		pr, shutdown, perr := gpupool.NewNVMLProbe(ctx, gpupool.NVMLLookupEnv(os.LookupEnv))
		switch {
		case perr == nil:
			closeNVML, probe = shutdown, pr
			opts = append(opts, gpupool.WithProbe(pr))
		case devMode == gpupool.ModeCUDA:
			if pr, ok := gpupool.DiagnoseCUDA(perr); ok {
				return nil, nil, fmt.Errorf("DEVICE=cuda: %s; remedy: %s: %w", pr.Cause, pr.Remedy, perr)
			}
			return nil, nil, fmt.Errorf("DEVICE=cuda: %w", perr)
		default:
			// The pool logs the CPU fallback once, with its own reason.
			log.Debug().Err(perr).Msg("NVML unavailable")
		}
	}
	tokens, rows := config.BatchShape(cfg, probe == nil)
	opts = append(opts, gpupool.MaxBatchTokens(tokens), gpupool.MaxBatchRows(rows))
	cpuMem, lim, err := config.CPUMemory(cfg, func() config.MemoryLimit { return config.DetectMemoryLimit("/") })
	if err != nil {
		closeNVML()
		return nil, nil, err
	}
	if cpuMem != nil {
		log.Info().Uint64("cpu_mem_limit_bytes", lim.Bytes).Str("source", lim.Source).Uint64("reserve_bytes", cpuMem.Reserve).
			Msg("CPU memory budget")
		opts = append(opts, gpupool.CPUMemory(*cpuMem))
	}
	pool, err := gpupool.New(ctx, factory, opts...)
	if err != nil {
		closeNVML()
		return nil, nil, err
	}
	// GPUs left out (lost, unreadable, ignored by CUDA) while others work:
	// said once here, not on every admission.
	if r, ok := probe.(gpupool.DeviceReporter); ok {
		if ws := r.DeviceWarnings(); len(ws) > 0 && hasGPU(pool) {
			log.Warn().Errs("reasons", ws).Msg("GPU discovery: some GPUs are left out or may be misnumbered")
		}
	}
	return pool, closeNVML, nil
}

// hasGPU reports whether the pool runs on at least one GPU; on the CPU the
// pool's own fallback warning already gave the reason.
func hasGPU(p *gpupool.Pool) bool {
	for _, d := range p.Devices() {
		if d.Kind == gpupool.CUDA {
			return true
		}
	}
	return false
}

// Close releases the stack in reverse order of opening.
func (s *Stack) Close(ctx context.Context) error {
	var errs []error
	for i := len(s.closers) - 1; i >= 0; i-- {
		errs = append(errs, s.closers[i](ctx))
	}
	s.closers = nil
	return errors.Join(errs...)
}

// InitORT resolves ORT_LIB as cli.ResolvePath does and starts the one ONNX
// Runtime environment of the process; every command that scores (run, score,
// bench, compare) starts it this way, so a missing library reads alike.
func InitORT(ortLib string) (shutdown func() error, err error) {
	if ortLib == "" {
		return nil, errors.New("ORT_LIB is not set and the scorer executable's folder, where its default lies, is unknown: point ORT_LIB at libonnxruntime.so.1")
	}
	lib, err := cli.ResolvePath(ortLib)
	if err != nil {
		return nil, fmt.Errorf("ORT_LIB: %w (run `make` to fetch ONNX Runtime, or point ORT_LIB at libonnxruntime.so.1)", err)
	}
	return model.InitRuntime(lib)
}

// PCIBusOrder sets CUDA_DEVICE_ORDER=PCI_BUS_ID when it is unset, before
// anything initialises CUDA: CUDA's default (fastest first) may number GPUs
// of different models differently from NVML, and the pool maps devices by
// PCI bus id. A value the user set is left alone.
func PCIBusOrder(log zerolog.Logger) {
	if _, set := os.LookupEnv("CUDA_DEVICE_ORDER"); set {
		return
	}
	if err := os.Setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID"); err != nil {
		log.Warn().Err(err).Msg("cannot set CUDA_DEVICE_ORDER=PCI_BUS_ID; CUDA may number GPUs differently from NVML")
		return
	}
	log.Debug().Msg("CUDA_DEVICE_ORDER was unset; set it to PCI_BUS_ID so CUDA numbers GPUs as NVML does")
}
