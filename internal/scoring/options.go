package scoring

import (
	"github.com/scorer/scorer/gpupool"
	"github.com/scorer/scorer/internal/fanout"
	"github.com/scorer/scorer/internal/fanout/scorecache"
	"github.com/scorer/scorer/model"
)

// Option changes one thing Open builds from the settings. Each is something
// a caller legitimately varies; everything else is the configuration's, so
// every subcommand runs the scorer the service runs.
type Option func(*options)

type options struct {
	runtime     *Runtime
	model       *model.Model
	wrapEngines func(gpupool.EngineFactory) gpupool.EngineFactory
	wrapPairs   func(fanout.PairScorer) fanout.PairScorer
	cacheSet    bool
	cache       *scorecache.Cache
	pool        []gpupool.Option
	// cpuCachedOnly: CPUCalibrationCachedOnly.
	cpuCachedOnly bool
}

// OnRuntime builds the stack on rt (ONNX Runtime started, NVML opened once)
// instead of starting its own: for a command that opens several stacks in
// one process. The stack's Close then leaves rt open; its owner closes it
// after the last stack, and rt keeps the stacks' close rule.
func OnRuntime(rt *Runtime) Option { return func(o *options) { o.runtime = rt } }

// WithModel builds the stack on m, loaded already from the same settings
// (LoadModel), instead of loading MODEL_DIR again: for a command that opens
// several stacks on one model (bench) or reads the model before its pools
// (doctor, gpu-proof).
func WithModel(m *model.Model) Option { return func(o *options) { o.model = m } }

// WrapEngines wraps the factory of the pool's engines (the sessions), so
// that every batch the pool runs passes through the wrapper: bench's batch
// recorder. The wrapper must pass an engine's optional abilities on
// (gpupool.Engine's MaxLength, for one) where the pool should see them.
func WrapEngines(wrap func(gpupool.EngineFactory) gpupool.EngineFactory) Option {
	return func(o *options) { o.wrapEngines = wrap }
}

// WrapPairs wraps what the transcript scorer hands its pairs to (the pool,
// behind the score cache): bench's record of each call's pairs in arrival
// order.
func WrapPairs(wrap func(fanout.PairScorer) fanout.PairScorer) Option {
	return func(o *options) { o.wrapPairs = wrap }
}

// NoCache builds the transcript scorer without a score cache, whatever
// SCORE_CACHE_BYTES says: for a measurement or comparison whose every pair
// must reach the engine.
func NoCache() Option { return WithCache(nil) }

// WithCache builds the transcript scorer over c (nil: none) instead of a
// cache of SCORE_CACHE_BYTES: for bench's revision workload, which reads
// its caches' statistics.
func WithCache(c *scorecache.Cache) Option {
	return func(o *options) { o.cacheSet, o.cache = true, c }
}

// OneGPU builds the pool on the one GPU whose UUID is uuid, with no CPU to
// fall back to: the configured pool on that GPU alone, as the doctor and
// gpu-proof check each GPU.
func OneGPU(uuid string) Option {
	return func(o *options) {
		o.pool = append(o.pool, gpupool.Mode(gpupool.ModeCUDA), gpupool.GPUIDs(uuid), gpupool.CPUFallback(false))
	}
}

// CPUCalibrationCachedOnly takes the CPU pool's memory per batch only from
// CPU_CALIBRATION_CACHE, never measuring it (11 s of production DeBERTa-v3
// in fp16 on 2 cores): the service measures and keeps it at its first
// start, the doctor only reads it. Without a CPU memory budget it changes
// nothing.
func CPUCalibrationCachedOnly() Option {
	return func(o *options) { o.cpuCachedOnly = true }
}
