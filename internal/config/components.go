package config

import (
	"fmt"
	"runtime"

	"github.com/scorer/scorer/gpupool"
	"github.com/scorer/scorer/internal/cli"
	"github.com/scorer/scorer/model"
	"github.com/scorer/scorer/schema"
)

// BatchShape is the inference batch bound a pool gets: MAX_BATCH_TOKENS and
// MAX_BATCH_ROWS as set, except that a pool with no GPU (DEVICE=cpu, or no
// NVML) is capped at CPU_MAX_BATCH_TOKENS and CPU_MAX_BATCH_ROWS. The
// defaults of the first pair suit a GPU, which wants wide batches; on CPU
// a batch of 256 rows spills the caches and scored ~15% fewer pairs/s than
// 8–24 rows (make bench, CPU batch shapes; docs/benchmarks.md). Taking the
// smaller value keeps an explicit MAX_BATCH_ROWS=8 meaningful on CPU too.
func BatchShape(cfg Config, cpuOnly bool) (tokens, rows int) {
	tokens, rows = cfg.MaxBatchTokens, cfg.MaxBatchRows
	if cpuOnly {
		tokens, rows = min(tokens, cfg.CPUMaxBatchTokens), min(rows, cfg.CPUMaxBatchRows)
	}
	return tokens, rows
}

// ModelOptions is how cfg becomes model.LoadOptions: MODEL_DIR resolved,
// MODEL_FILE, SCORE_MODE, ENTAILMENT_INDEX, PAIR_ENCODING and
// PAIR_SEPARATOR. Every subcommand that loads a model goes through it, so
// none can score with a setting the others ignore.
func ModelOptions(cfg Config) (model.LoadOptions, error) {
	dir, err := cli.ResolvePath(cfg.ModelDir)
	if err != nil {
		return model.LoadOptions{}, fmt.Errorf("MODEL_DIR: %w", err)
	}
	mode, err := model.ParseScoreMode(cfg.ScoreMode)
	if err != nil {
		return model.LoadOptions{}, err
	}
	enc, err := model.ParsePairEncoding(cfg.PairEncoding)
	if err != nil {
		return model.LoadOptions{}, err
	}
	lo := model.LoadOptions{Dir: dir, ONNXFile: cfg.ModelFile, ScoreMode: mode, PairEncoding: enc, PairSeparator: cfg.PairSeparator}
	if cfg.EntailmentIndex >= 0 {
		idx := cfg.EntailmentIndex
		lo.EntailmentIndex = &idx
	}
	return lo, nil
}

// CPUPlan splits the machine's cores between CPU workers and ORT intra-op
// threads. By default every worker gets one thread and there are as many
// workers as cores (up to 4): on the small models, two single-threaded runs
// side by side scored 10–19% more pairs/s than one run on two threads for
// nli-unigram-small, and −4% to +15% for nli-wordpiece-small (make bench,
// CPU scaling, docs/benchmarks.md). An explicit WORKERS or CPU_THREADS takes the cores it
// leaves to the other.
func CPUPlan(cfg Config) (workers, threads int) {
	// GOMAXPROCS, not NumCPU: since Go 1.25 it follows the container's CPU
	// limit, which is what the pod may really use.
	n := runtime.GOMAXPROCS(0)
	workers, threads = cfg.Workers, cfg.CPUThreads
	switch {
	case workers == 0 && threads == 0:
		workers = min(n, 4)
		threads = max(1, n/workers)
	case workers == 0:
		workers = max(1, n/threads)
	case threads == 0:
		threads = max(1, n/workers)
	}
	return workers, threads
}

// SessionConfig is how the pool's sessions are built from Config. The CUDA
// arena's gpu_mem_limit sits gpupool.DefaultGPUMemMargin below
// GPU_MEM_FRACTION × total, the pool's admission limit: NVML's used memory
// also counts the CUDA context and cuBLAS/cuDNN workspaces, and an arena
// allowed to reach the admission limit itself would keep used memory above
// it for good.
// GPU_MEM_LIMIT, when set, lowers the cap to this process's budget the same
// way, so scorers sharing a GPU cannot grow into each other's share.
func SessionConfig(cfg Config) gpupool.SessionConfig {
	_, threads := CPUPlan(cfg)
	budget, _ := gpupool.ParseMemLimit(cfg.GPUMemLimit) // NewPool refuses a bad value before any session opens
	return gpupool.SessionConfig{IntraOpThreads: threads, GPUMemFraction: cfg.GPUMemFraction,
		GPUMemMargin: gpupool.DefaultGPUMemMargin, GPUMemBudget: budget, TF32: cfg.GPUTF32}
}

// Limits is the input limits of Config as schema.Limits, the one place
// they are built (the scorer's decoder and the topic sizes use them).
func (c *Config) Limits() schema.Limits {
	l := schema.DefaultLimits()
	l.MaxMessageBytes = c.MaxMessageBytes
	l.MaxSentences = c.MaxSentences
	l.MaxSentenceBytes = c.MaxSentenceBytes
	return l
}
