package gpupool

import (
	"fmt"
	"maps"
	"runtime"
	"strconv"

	"github.com/scorer/scorer/model"
	"github.com/scorer/scorer/model/ortenv"
)

// explain wraps err as its CUDAProblem when ortenv.DiagnoseCUDA knows it.
func explain(err error) error {
	if p, ok := ortenv.DiagnoseCUDA(err); ok {
		return p
	}
	return err
}

// SessionConfig tunes the ONNX Runtime sessions SessionFactory creates.
type SessionConfig struct {
	// IntraOpThreads is the CPU session's intra-op thread count; 0 means
	// runtime.GOMAXPROCS(0), the cores the container may use, for a pool
	// with one CPU worker. With several CPU workers set it to cores/workers.
	// CUDA sessions pass it through as is (0 = ORT's default).
	IntraOpThreads int
	// InterOpThreads is passed through (0 = ORT's default).
	InterOpThreads int
	// GPUMemFraction caps each CUDA session's arena (ORT's gpu_mem_limit)
	// at this share of the device's memory less GPUMemMargin, so ORT fails
	// a too-large batch with an OOM the pool can split instead of starving
	// other tenants. 0 means no cap; use the pool's MemFraction.
	GPUMemFraction float64
	// GPUMemMargin is how far below GPUMemFraction × total the arena cap
	// sits: room for what NVML counts as used beside the arena (the CUDA
	// context, cuBLAS/cuDNN workspaces), so a full arena still leaves used
	// memory under the pool's admission limit. Values below
	// DefaultGPUMemMargin are raised to it.
	GPUMemMargin uint64
	// GPUMemLimit is an explicit gpu_mem_limit in bytes; it wins over
	// GPUMemFraction, GPUMemBudget and GPUMemMargin.
	GPUMemLimit uint64
	// GPUMemBudget is this process's share of the device (the pool's
	// GPUMemLimit option, GPU_MEM_LIMIT): the arena cap sits GPUMemMargin
	// below it, or below GPUMemFraction × total if that is smaller, so
	// two scorers sharing a GPU cannot grow into each other's share.
	GPUMemBudget MemLimit
	// TF32 lets CUDA use TF32 tensor cores for float32 matrix products
	// (the provider's use_tf32; ORT's own default is on). The zero value
	// is off, bit-faithful to the CPU; the scorer's GPU_TF32 defaults to
	// on: on an H200 with production-size DeBERTa-v3 in fp32 it ran 3.3×
	// the pairs/s, and moved scores by at most 2.2e-4 against the CPU (6e-7
	// off) with every decision equal. A score within that of THRESHOLD can
	// still flip. `scorer doctor` measures the difference on the host's GPU.
	TF32 bool
	// CUDAOptions are extra CUDA provider options, applied last (see ORT's
	// CUDA execution provider documentation for keys).
	CUDAOptions map[string]string
	// PadToMultipleOf and CPUPadToMultipleOf are CUDA and CPU sessions'
	// model.SessionOptions.PadToMultipleOf (PAD_TO_MULTIPLE_OF); 0 or 1
	// pads to the longest pair only.
	PadToMultipleOf, CPUPadToMultipleOf int
	// GraphCache is the CPU session's model.SessionOptions.GraphCache
	// (GRAPH_CACHE): where ONNX Runtime's optimised graph with its
	// prepacked weights is kept between starts; "" keeps none. CUDA
	// sessions have none.
	GraphCache string
	// GraphCacheTrusted is model.SessionOptions.GraphCacheTrusted
	// (GRAPH_CACHE_TRUSTED).
	GraphCacheTrusted bool
}

// SessionFactory returns an EngineFactory that opens one model.Session per
// device: a CPU session with IntraOpThreads threads, or a session with the
// CUDA execution provider on the device's index. The CUDA arena grows by
// exactly what is requested (arena_extend_strategy=kSameAsRequested), so
// device memory tracks real need and the pool's memory readings stay
// meaningful; the default power-of-two growth would reserve memory no batch
// uses. The ORT environment must already exist (ortenv.InitRuntime).
func SessionFactory(m *model.Model, cfg SessionConfig) EngineFactory {
	return func(dev Device) (Engine, error) {
		opts, err := sessionOptions(dev, cfg)
		if err != nil {
			return nil, err
		}
		s, err := m.NewSession(opts)
		if err != nil {
			return nil, fmt.Errorf("gpupool: opening %s session: %w", dev.Kind, explain(err))
		}
		return s, nil
	}
}

// ModelSessionOptions is the model.SessionOptions a pool's sessions on dev
// are created with: tools that profile a session (tools/ortprofile) run
// what the pool runs.
func ModelSessionOptions(dev Device, cfg SessionConfig) (model.SessionOptions, error) {
	return sessionOptions(dev, cfg)
}

// sessionOptions is the model.SessionOptions SessionFactory uses for dev.
func sessionOptions(dev Device, cfg SessionConfig) (model.SessionOptions, error) {
	opts := model.SessionOptions{IntraOpThreads: cfg.IntraOpThreads, InterOpThreads: cfg.InterOpThreads}
	switch dev.Kind {
	case CPU:
		if opts.IntraOpThreads == 0 {
			opts.IntraOpThreads = runtime.GOMAXPROCS(0) // follows the container CPU limit
		}
		// CPU memory calibration (CPUMemory) empties the arena between
		// shapes through this; runs never shrink it.
		opts.ShrinkArenas = "cpu:0"
		opts.PadToMultipleOf = cfg.CPUPadToMultipleOf
		opts.GraphCache, opts.GraphCacheTrusted = cfg.GraphCache, cfg.GraphCacheTrusted
	case CUDA:
		opts.CUDA = cudaProviderOptions(dev, cfg)
		// Memory patterns pre-plan one block per input shape from its
		// first run; a shape's second run then asks the arena for one
		// block of the whole peak that the first run's blocks cannot
		// serve, doubling its footprint. Admission's memory model
		// assumes a run allocates its activations as it goes.
		opts.DisableMemPattern = true
		// Calibration empties the arena between shapes through this.
		opts.ShrinkArenas = fmt.Sprintf("gpu:%d", dev.Index)
		opts.PadToMultipleOf = cfg.PadToMultipleOf
	default:
		return model.SessionOptions{}, fmt.Errorf("gpupool: unknown device kind %v", dev.Kind)
	}
	return opts, nil
}

// CheckCUDA appends the CUDA execution provider for dev to throwaway
// session options, with the options SessionFactory gives dev's sessions,
// without loading a model (ortenv.CheckCUDA). A nil error means ORT's CUDA
// provider loaded with its libraries, the CUDA runtime and the driver;
// otherwise the error is a *ortenv.CUDAProblem where the cause is known
// (errors.As). Startup, `scorer doctor` and the packaging test use it to
// say why the GPU path cannot work.
func CheckCUDA(dev Device, cfg SessionConfig) error {
	return ortenv.CheckCUDA(cudaProviderOptions(dev, cfg))
}

// DefaultGPUMemMargin is the least GPUMemMargin, and what the pool's
// admission counts beside the weights and the arena until it has measured
// it: the first GPU run (H200, ORT 1.29, CUDA 13) measured the CUDA context
// and workspaces of two workers at 667 MiB (fp16) and 764 MiB (fp32), past
// the 512 MiB this used to be.
const DefaultGPUMemMargin = 768 << 20

// cudaProviderOptions builds the CUDA execution provider's key/value options
// for dev. device_id is dev.Index, the CUDA ordinal (the probe maps it
// through CUDA_VISIBLE_DEVICES).
func cudaProviderOptions(dev Device, cfg SessionConfig) map[string]string {
	o := map[string]string{
		"device_id":             strconv.Itoa(dev.Index),
		"arena_extend_strategy": "kSameAsRequested",
		"use_tf32":              "0",
	}
	if cfg.TF32 {
		o["use_tf32"] = "1"
	}
	limit := cfg.GPUMemLimit
	if limit == 0 && dev.TotalMemory > 0 {
		budget := cfg.GPUMemFraction * float64(dev.TotalMemory)
		if b := cfg.GPUMemBudget.Of(dev.TotalMemory); b > 0 && (budget == 0 || float64(b) < budget) {
			budget = float64(b)
		}
		if budget > 0 {
			limit = arenaLimit(budget, max(cfg.GPUMemMargin, DefaultGPUMemMargin))
		}
	}
	if limit > 0 {
		o["gpu_mem_limit"] = strconv.FormatUint(limit, 10)
	}
	maps.Copy(o, cfg.CUDAOptions)
	return o
}

// ArenaLimit is the gpu_mem_limit SessionFactory gives dev's CUDA arena
// under cfg (0: none), for reports such as `scorer doctor`.
func ArenaLimit(dev Device, cfg SessionConfig) uint64 {
	n, _ := strconv.ParseUint(cudaProviderOptions(dev, cfg)["gpu_mem_limit"], 10, 64)
	return n
}

// arenaLimit is the arena cap under an admission limit of budget bytes: the
// budget less margin, or half the budget on a GPU too small for the margin.
func arenaLimit(budget float64, margin uint64) uint64 {
	if budget > 2*float64(margin) {
		return uint64(budget) - margin
	}
	return uint64(budget / 2)
}
