package scoring

import (
	"context"
	"fmt"
	"os"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/scorer/scorer/gpupool"
	"github.com/scorer/scorer/internal/config"
	"github.com/scorer/scorer/model"
	"github.com/scorer/scorer/model/ortenv"
)

// newPool starts the device pool for m: the options cfg.PoolOptions gives,
// then what is wiring rather than configuration (the logger, reg, probe
// when not nil, calibration up to m's maximum length), then extra (what an
// Open option changes). factory makes its engines. The settings the pool
// was built with are logged at debug level ("scorer built"), the same line
// for every subcommand.
func newPool(ctx context.Context, cfg config.Config, m *model.Model, probe gpupool.Probe, log zerolog.Logger, reg prometheus.Registerer,
	factory gpupool.EngineFactory, extra ...gpupool.Option) (*gpupool.Pool, error) {
	host := config.DetectHost()
	opts, err := cfg.PoolOptions(host)
	if err != nil {
		return nil, err
	}
	opts = append(opts,
		// Calibration pairs longer than the model's maximum would be
		// rejected, and a rejected calibration drops the GPU.
		gpupool.Calibrate(gpupool.Calibration{MaxLen: m.MaxLength}),
		gpupool.Logger(log.With().Str("component", "gpupool").Logger()),
		gpupool.Registerer(reg))
	if probe != nil {
		opts = append(opts, gpupool.WithProbe(probe))
	}
	opts = append(opts, extra...)
	if mem, lim, _ := cfg.CPUMemory(host); mem != nil {
		log.Info().Uint64("cpu_mem_limit_bytes", lim.Bytes).Str("source", lim.Source).Uint64("reserve_bytes", mem.Reserve).
			Msg("CPU memory budget")
	}
	pool, err := gpupool.New(ctx, factory, opts...)
	if err != nil {
		return nil, err
	}
	// GPUs left out (lost, unreadable, ignored by CUDA) while others work:
	// said once here, not on every admission.
	if r, ok := probe.(gpupool.DeviceReporter); ok {
		if ws := r.DeviceWarnings(); len(ws) > 0 && hasGPU(pool) {
			log.Warn().Errs("reasons", ws).Msg("GPU discovery: some GPUs are left out or may be misnumbered")
		}
	}
	logBuilt(log, cfg, host, pool)
	return pool, nil
}

// probeError is what a pool built from cfg makes of NVML failing to open
// (err): an error naming the cause under DEVICE=cuda; nil under DEVICE=auto,
// where the pool then logs its CPU fallback once, with its own reason.
func probeError(cfg config.Config, err error, log zerolog.Logger) error {
	if cfg.Device == string(gpupool.ModeCUDA) {
		if pr, ok := ortenv.DiagnoseCUDA(err); ok {
			return fmt.Errorf("DEVICE=cuda: %s; remedy: %s: %w", pr.Cause, pr.Remedy, err)
		}
		return fmt.Errorf("DEVICE=cuda: %w", err)
	}
	log.Debug().Err(err).Msg("NVML unavailable")
	return nil
}

// logBuilt logs, at debug level, what a scorer built from cfg runs with:
// the pool's devices, batch shape and workers, the session settings, the
// CPU memory budget (as configured; what calibration makes of it is the
// pool's own line) and the input limits. Every subcommand that builds a
// pool logs this one line ("scorer built"), so their settings can be
// compared.
func logBuilt(log zerolog.Logger, cfg config.Config, host config.Host, pool *gpupool.Pool) {
	ev := log.Debug()
	if !ev.Enabled() {
		return
	}
	tokens, rows := pool.BatchShape()
	sc := cfg.SessionConfig(host)
	var devices []string
	workers := map[string]int{}
	for _, d := range pool.Stats().Devices {
		devices = append(devices, d.Device.Label())
		workers[d.Device.Label()] = d.Workers
	}
	if mem, _, err := cfg.CPUMemory(host); err == nil && mem != nil {
		ev = ev.Uint64("cpu_mem_limit", mem.Limit).Uint64("cpu_mem_reserve", mem.Reserve).Uint64("cpu_max_batch_bytes", mem.BatchBytes)
	}
	lim := cfg.Limits()
	ev.Strs("devices", devices).Any("workers", workers).Int("max_batch_tokens", tokens).Int("max_batch_rows", rows).
		Int("intra_op_threads", sc.IntraOpThreads).Float64("gpu_mem_fraction", sc.GPUMemFraction).
		Str("gpu_mem_limit", sc.GPUMemBudget.String()).Bool("gpu_tf32", sc.TF32).
		Int("max_message_bytes", lim.MaxMessageBytes).Int("max_sentences", lim.MaxSentences).
		Int("max_sentence_bytes", lim.MaxSentenceBytes).Msg("scorer built")
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
