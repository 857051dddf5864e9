package bench

import (
	"context"

	"github.com/rs/zerolog"

	"github.com/scorer/scorer/gpupool"
	"github.com/scorer/scorer/internal/config"
	"github.com/scorer/scorer/internal/fanout"
	"github.com/scorer/scorer/internal/fanout/scorecache"
	"github.com/scorer/scorer/internal/scoring"
	"github.com/scorer/scorer/model"
	"github.com/scorer/scorer/schema"
)

// perfReport holds the sections about doing less work per pair: CPU batch
// shapes, the score cache on a revision workload, and int8 against fp32.
// One per model folder, the production-size stand-in included.
type perfReport struct {
	Model    string          `json:"model"`
	Shapes   []shapePoint    `json:"cpu_batch_shapes,omitempty"`
	Revision *revisionResult `json:"revision,omitempty"`
	Int8     *int8Result     `json:"int8,omitempty"`
}

// cpuShape is one CPU pool configuration.
type cpuShape struct {
	Rows    int `json:"max_batch_rows"`
	Tokens  int `json:"max_batch_tokens"`
	Workers int `json:"workers"`
	Threads int `json:"intra_op_threads"`
}

// apply puts s's batch shape, workers and threads in place of cfg's: the
// CPU caps too, so the pool runs exactly s.
func (s cpuShape) apply(cfg config.Config) config.Config {
	cfg.MaxBatchTokens, cfg.CPUMaxBatchTokens = s.Tokens, s.Tokens
	cfg.MaxBatchRows, cfg.CPUMaxBatchRows = s.Rows, s.Rows
	cfg.Workers, cfg.CPUThreads = s.Workers, s.Threads
	return cfg
}

// cpuScorer is a CPU pool with a TranscriptScorer over it, optionally
// through a score cache.
type cpuScorer struct {
	stack *scoring.Stack
	pool  *gpupool.Pool
	ts    *fanout.TranscriptScorer
	plain *fanout.TranscriptScorer // without the cache, for the warm-up
}

// newCPUScorer opens the stack the service builds with DEVICE=cpu (its
// batch shape, CPU plan and memory budget, from cfg) on rt and m, with
// cache as its score cache (nil: none, whatever SCORE_CACHE_BYTES says:
// these sections measure the engine, and revision brings its own caches).
func newCPUScorer(ctx context.Context, rt *scoring.Runtime, cfg config.Config, m *model.Model, cache *scorecache.Cache) (*cpuScorer, error) {
	cfg.Device = string(gpupool.ModeCPU)
	stack, err := scoring.Open(ctx, cfg, zerolog.Nop(), nil, scoring.OnRuntime(rt), scoring.WithModel(m), scoring.WithCache(cache))
	if err != nil {
		return nil, err
	}
	cs := &cpuScorer{stack: stack, pool: stack.Pool, ts: stack.Scorer}
	// The warm-up must not fill the cache the measurement reads: a second
	// scorer over the same pool, without it.
	if cs.plain, err = fanout.NewTranscriptScorer(stack.Model, stack.Labels, stack.Pool); err != nil {
		_ = stack.Close(context.Background())
		return nil, err
	}
	return cs, nil
}

// warm scores a few sentences untimed, without the cache, so first-run
// allocation in ORT is charged to no measurement.
func (cs *cpuScorer) warm(ctx context.Context, ev schema.TranscriptEvent) error {
	w := ev
	w.Sections = map[string][]string{}
	for name, sents := range ev.Sections {
		w.Sections[name] = sents[:min(len(sents), 16)]
	}
	_, err := cs.plain.Score(ctx, []schema.TranscriptEvent{w})
	return err
}

func (cs *cpuScorer) close() { _ = cs.stack.Close(context.Background()) }

// int8File is the quantized graph the bench compares against model.onnx.
const int8File = "onnx/model_quantized.onnx"
