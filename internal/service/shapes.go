package service

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
