package scoring

import (
	"context"
	"fmt"
	"os"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/scorer/scorer/gpupool"
	"github.com/scorer/scorer/gpupool/hostcheck"
	"github.com/scorer/scorer/internal/config"
	"github.com/scorer/scorer/model"
)

// SessionFactory opens m's sessions with cfg's session settings
// (config.SessionConfig) on this host.
func SessionFactory(cfg config.Config, m *model.Model) gpupool.EngineFactory {
	return gpupool.SessionFactory(m, cfg.SessionConfig(config.DetectHost()))
}

// NewPool starts NVML (unless DEVICE=cpu) and the device pool for m: the
// options cfg.PoolOptions gives, then what is wiring rather than
// configuration (the logger, reg, NVML, calibration up to m's maximum
// length). Its engines are m's sessions with cfg's session settings;
// wrap, when not nil, wraps that factory (the stack waits for the model's
// load in it, the bench records batches). The returned func shuts NVML down
// after the pool is closed. The settings the pool was built with are logged
// at debug level ("scorer built"), the same line for every subcommand.
// extra options are applied last (the doctor's CPU calibration taken only
// from the cache).
func NewPool(ctx context.Context, cfg config.Config, m *model.Model, log zerolog.Logger, reg prometheus.Registerer,
	wrap func(gpupool.EngineFactory) gpupool.EngineFactory, extra ...gpupool.Option) (*gpupool.Pool, func(), error) {
	host := config.DetectHost()
	opts, err := cfg.PoolOptions(host)
	if err != nil {
		return nil, nil, err
	}
	factory := gpupool.SessionFactory(m, cfg.SessionConfig(host))
	if wrap != nil {
		factory = wrap(factory)
	}
	opts = append(opts,
		// Calibration pairs longer than the model's maximum would be
		// rejected, and a rejected calibration drops the GPU.
		gpupool.Calibrate(gpupool.Calibration{MaxLen: m.MaxLength}),
		gpupool.Logger(log.With().Str("component", "gpupool").Logger()),
		gpupool.Registerer(reg))
	opts = append(opts, extra...)
	closeNVML := func() {}
	probe, closeProbe, err := openProbe(ctx, cfg, log)
	if err != nil {
		return nil, nil, err
	}
	if probe != nil {
		closeNVML = closeProbe
		opts = append(opts, gpupool.WithProbe(probe))
	}
	if mem, lim, _ := cfg.CPUMemory(host); mem != nil {
		log.Info().Uint64("cpu_mem_limit_bytes", lim.Bytes).Str("source", lim.Source).Uint64("reserve_bytes", mem.Reserve).
			Msg("CPU memory budget")
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
	LogBuilt(log, cfg, host, pool)
	return pool, closeNVML, nil
}

// openProbe opens NVML unless DEVICE=cpu; under DEVICE=auto, when NVML is
// unavailable, gpupool.UnavailableProbe with the reason, so the pool logs
// its CPU fallback once with it and does not open NVML a second time; an
// error naming the cause under DEVICE=cuda.
func openProbe(ctx context.Context, cfg config.Config, log zerolog.Logger) (gpupool.Probe, func(), error) {
	if cfg.Device == string(gpupool.ModeCPU) {
		return nil, nil, nil
	}
	PCIBusOrder(log)
	// The CUDA runtime reads CUDA_VISIBLE_DEVICES from the real process
	// environment, so the probe must too, to number GPUs as CUDA does.
	probe, shutdown, err := gpupool.NewNVMLProbe(ctx, gpupool.NVMLLookupEnv(os.LookupEnv))
	switch {
	case err == nil:
		return probe, shutdown, nil
	case cfg.Device == string(gpupool.ModeCUDA):
		if pr, ok := hostcheck.DiagnoseCUDA(err); ok {
			return nil, nil, fmt.Errorf("DEVICE=cuda: %s; remedy: %s: %w", pr.Cause, pr.Remedy, err)
		}
		return nil, nil, fmt.Errorf("DEVICE=cuda: %w", err)
	}
	log.Debug().Err(err).Msg("NVML unavailable")
	return gpupool.UnavailableProbe(err), func() {}, nil
}

// LogBuilt logs, at debug level, what a scorer built from cfg runs with:
// the pool's devices, batch shape and workers, the session settings, the
// CPU memory budget (as configured; what calibration makes of it is the
// pool's own line) and the input limits. Every subcommand that builds a
// pool logs this one line ("scorer built"), so their settings can be
// compared.
func LogBuilt(log zerolog.Logger, cfg config.Config, host config.Host, pool *gpupool.Pool) {
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
