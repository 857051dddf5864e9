package config

import (
	"fmt"
	"runtime"
	"strconv"
	"strings"

	"github.com/segmentio/kafka-go"

	"github.com/scorer/scorer/consumer"
	"github.com/scorer/scorer/gpupool"
	"github.com/scorer/scorer/internal/fanout"
	"github.com/scorer/scorer/model"
	"github.com/scorer/scorer/producer"
	"github.com/scorer/scorer/schema"
)

// This file is the one place Config becomes the components' settings. A
// subcommand takes what these methods return and appends its own overrides
// (gpupool options apply in order, the last wins, as in franz-go's kgo; the
// plain structs are edited field by field), so a setting read here reaches
// every scorer the binary builds: `scorer run`, `score`, `bench`, `doctor`,
// `compare` and `gpu-proof` cannot drift apart.

// Host is what the machine contributes to the settings: the cores this
// process may use and its memory limit. DetectHost reads them; tests pass
// their own.
type Host struct {
	// Cores is runtime.GOMAXPROCS(0), which since Go 1.25 follows the
	// container's CPU limit: what the pod may really use.
	Cores int
	// Memory is DetectMemoryLimit("/"): the cgroup's limit, else physical
	// memory.
	Memory MemoryLimit
}

// DetectHost reads this process's cores and memory limit.
func DetectHost() Host {
	return Host{Cores: runtime.GOMAXPROCS(0), Memory: DetectMemoryLimit("/")}
}

// CPUPlan splits the host's cores between CPU workers and ORT intra-op
// threads. By default every worker gets one thread and there are as many
// workers as cores (up to 4): on the small models, two single-threaded runs
// side by side scored 10–19% more pairs/s than one run on two threads for
// nli-unigram-small, and −4% to +15% for nli-wordpiece-small (make bench,
// CPU scaling, docs/benchmarks.md). An explicit WORKERS or CPU_THREADS takes
// the cores it leaves to the other.
func (c *Config) CPUPlan(h Host) (workers, threads int) {
	n := max(h.Cores, 1)
	workers, threads = c.Workers, c.CPUThreads
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

// SessionConfig is how the pool's sessions are built: CPU_THREADS (after
// CPUPlan), GPU_MEM_FRACTION, GPU_MEM_LIMIT, GPU_TF32 and GRAPH_CACHE (the
// CPU session's). The CUDA arena's
// gpu_mem_limit sits gpupool.DefaultGPUMemMargin below GPU_MEM_FRACTION ×
// total, the pool's admission limit: NVML's used memory also counts the
// CUDA context and cuBLAS/cuDNN workspaces, and an arena allowed to reach
// the admission limit itself would keep used memory above it for good.
// GPU_MEM_LIMIT, when set, lowers the cap to this process's budget the same
// way, so scorers sharing a GPU cannot grow into each other's share.
func (c *Config) SessionConfig(h Host) gpupool.SessionConfig {
	_, threads := c.CPUPlan(h)
	budget, _ := gpupool.ParseMemLimit(c.GPUMemLimit) // Validate refuses a bad value
	cpuPad, cudaPad, _ := c.PadMultiples()            // likewise
	return gpupool.SessionConfig{IntraOpThreads: threads, GPUMemFraction: c.GPUMemFraction,
		GPUMemMargin: gpupool.DefaultGPUMemMargin, GPUMemBudget: budget, TF32: c.GPUTF32,
		PadToMultipleOf: cudaPad, CPUPadToMultipleOf: cpuPad, GraphCache: calibrationCache(c.GraphCache, "graph-cache"),
		GraphCacheTrusted: c.GraphCacheTrusted}
}

// AutoPadCUDA and AutoPadCPU are PAD_TO_MULTIPLE_OF=auto's values. On a
// GPU, ONNX Runtime's CUDA attention runs its fused kernels only at
// lengths that are multiples of 8 in fp16 (4·sizeof(T)), and cuBLAS takes
// align1 GEMM kernels at odd lengths (14.3% of kernel time at ~500 tokens
// on an H200). On the CPU, padding is only more tokens to compute: see
// docs/gpu.md (Batch lengths) for the A/B.
const (
	AutoPadCUDA = 8
	AutoPadCPU  = 1
)

// PadMultiples is PAD_TO_MULTIPLE_OF for CPU and CUDA sessions: auto is
// AutoPadCPU and AutoPadCUDA, a number is both.
func (c *Config) PadMultiples() (cpu, cuda int, err error) {
	if c.PadToMultipleOf == "auto" {
		return AutoPadCPU, AutoPadCUDA, nil
	}
	n, err := strconv.Atoi(strings.TrimSpace(c.PadToMultipleOf))
	if err != nil || n < 1 {
		return 0, 0, fmt.Errorf("PAD_TO_MULTIPLE_OF must be auto or a whole number of at least 1, got %q", c.PadToMultipleOf)
	}
	return n, n, nil
}

// PoolOptions is how the pool is built: DEVICE, GPU_IDS, GPU_MEM_FRACTION,
// GPU_MEM_LIMIT, GPU_PROBATION, GPU_CALIBRATION_CACHE, WORKERS and the CPU
// plan, both batch shapes (MAX_BATCH_TOKENS and MAX_BATCH_ROWS for a GPU,
// capped on a CPU pool at CPU_MAX_BATCH_TOKENS and CPU_MAX_BATCH_ROWS: the
// pool picks, since only it knows whether a GPU works) and the CPU memory
// budget. The wide GPU defaults spill a CPU's caches: 256 rows scored ~15% fewer pairs/s than
// 8–24 rows there (make bench, CPU batch shapes); taking the smaller value
// keeps an explicit MAX_BATCH_ROWS=8 meaningful on a CPU too. What is not
// configuration (logger, metrics, NVML, calibration from the model) the
// caller adds.
func (c *Config) PoolOptions(h Host) ([]gpupool.Option, error) {
	mode, err := gpupool.ParseDeviceMode(c.Device)
	if err != nil {
		return nil, err
	}
	memLimit, err := gpupool.ParseMemLimit(c.GPUMemLimit)
	if err != nil {
		return nil, fmt.Errorf("GPU_MEM_LIMIT: %w", err)
	}
	cpuWorkers, _ := c.CPUPlan(h)
	opts := []gpupool.Option{
		gpupool.Mode(mode),
		gpupool.MemFraction(c.GPUMemFraction),
		gpupool.GPUMemLimit(memLimit),
		gpupool.Probation(c.GPUProbation),
		gpupool.MaxBatchTokens(c.MaxBatchTokens),
		gpupool.MaxBatchRows(c.MaxBatchRows),
		gpupool.CPUBatchShape(c.CPUMaxBatchTokens, c.CPUMaxBatchRows),
		gpupool.CPUWorkers(cpuWorkers),
	}
	if len(c.GPUIDs) > 0 {
		opts = append(opts, gpupool.GPUIDs(c.GPUIDs...))
	}
	if c.Workers > 0 {
		opts = append(opts, gpupool.WorkersPerDevice(c.Workers))
	}
	if dir := calibrationCache(c.GPUCalibrationCache, "gpu-calibration"); dir != "" {
		opts = append(opts, gpupool.GPUCalibrationCache(dir))
	}
	mem, _, err := c.CPUMemory(h)
	if err != nil {
		return nil, err
	}
	if mem != nil {
		opts = append(opts, gpupool.CPUMemory(*mem))
	}
	return opts, nil
}

// ModelOptions is how the model is loaded: MODEL_DIR resolved, MODEL_FILE, MODEL_NAME,
// SCORE_MODE, ENTAILMENT_INDEX, CONTRADICTION_INDEX, PAIR_ENCODING, PAIR_SEPARATOR and
// REL_ATTENTION_REWRITE.
func (c *Config) ModelOptions() (model.LoadOptions, error) {
	dir, err := ResolvePath(c.ModelDir)
	if err != nil {
		return model.LoadOptions{}, fmt.Errorf("MODEL_DIR: %w", err)
	}
	mode, err := model.ParseScoreMode(c.ScoreMode)
	if err != nil {
		return model.LoadOptions{}, err
	}
	enc, err := model.ParsePairEncoding(c.PairEncoding)
	if err != nil {
		return model.LoadOptions{}, err
	}
	lo := model.LoadOptions{Dir: dir, ONNXFile: c.ModelFile, Name: c.ModelName, ScoreMode: mode, PairEncoding: enc, PairSeparator: c.PairSeparator,
		KeepRelativeAttention: !c.RelAttnRewrite, AttentionRewrites: c.AttentionRewrites}
	if c.EntailmentIndex >= 0 {
		idx := c.EntailmentIndex
		lo.EntailmentIndex = &idx
	}
	if c.ContradictionIndex >= 0 {
		idx := c.ContradictionIndex
		lo.ContradictionIndex = &idx
	}
	return lo, nil
}

// LabelConfig is what each sentence is scored against: HYPOTHESIS_TEMPLATE,
// LABELS and THRESHOLD.
func (c *Config) LabelConfig() fanout.LabelConfig {
	return fanout.LabelConfig{Template: c.HypothesisTemplate, Labels: c.Labels, Threshold: c.Threshold}
}

// Limits is the input limits, MAX_MESSAGE_BYTES, MAX_SENTENCES and
// MAX_SENTENCE_BYTES, over schema's defaults for the rest: what every
// decoder of TranscriptEvents uses and what the topics are sized from.
func (c *Config) Limits() schema.Limits {
	l := schema.DefaultLimits()
	l.MaxMessageBytes = c.MaxMessageBytes
	l.MaxSentences = c.MaxSentences
	l.MaxSentenceBytes = c.MaxSentenceBytes
	return l
}

// ConsumerConfig is the input side: brokers, topic, group, where a new
// group starts (KAFKA_START_OFFSET) and the group's timings, the consumer
// batches and in-flight bounds, the input limits and SHUTDOWN_TIMEOUT,
// which bounds the consumer's whole stop (drain, final commit, leaving the
// group). RevokeTimeout and HeartbeatInterval are left to the consumer,
// which derives them from KAFKA_REBALANCE_TIMEOUT and KAFKA_SESSION_TIMEOUT
// (a fixed revoke timeout would reject rebalance timeouts up to 10 s).
func (c *Config) ConsumerConfig(sec KafkaSecurity) consumer.Config {
	return consumer.Config{
		Brokers: c.KafkaBrokers, Topic: c.InputTopic, GroupID: c.GroupID, ClientID: c.ClientID,
		BatchMaxMessages: c.BatchMaxMessages, BatchMaxBytes: c.BatchMaxBytes, BatchMaxWait: c.BatchMaxWait,
		MaxMessageBytes: c.MaxMessageBytes, MaxInflightBatches: c.MaxInflightBatches, MaxUncommitted: c.MaxUncommitted,
		Limits: c.Limits(), ShutdownTimeout: c.ShutdownTimeout, Dialer: sec.Dialer(c.ClientID),
		SessionTimeout: c.SessionTimeout, RebalanceTimeout: c.RebalanceTimeout,
		ReadUncommitted: c.IsolationLevel == "read_uncommitted",
		StartOffset:     startOffset(c.StartOffset),
	}
}

// startOffset is KAFKA_START_OFFSET as the consumer takes it; Validate
// allows only earliest and latest.
func startOffset(s string) int64 {
	if s == "latest" {
		return kafka.LastOffset
	}
	return kafka.FirstOffset
}

// ProducerConfig is the output side: brokers, the output, rows and
// dead-letter topics, OUTPUT_FORMAT and OUTPUT_KEY. The topics'
// max.message.bytes (TopicMaxBytes) is the cluster's, read at start.
func (c *Config) ProducerConfig(sec KafkaSecurity) producer.Config {
	return producer.Config{
		Brokers: c.KafkaBrokers, Topic: c.OutputTopic, RowsTopic: c.RowsTopic, DLQTopic: c.DLQTopic,
		Format: c.OutputFormat, Key: c.OutputKey, ClientID: c.ClientID, Transport: sec.Transport(c.ClientID),
	}
}
