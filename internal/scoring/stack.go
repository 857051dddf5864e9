package scoring

import (
	"context"
	"errors"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/scorer/scorer/gpupool"
	"github.com/scorer/scorer/internal/config"
	"github.com/scorer/scorer/internal/fanout"
	"github.com/scorer/scorer/internal/fanout/scorecache"
	"github.com/scorer/scorer/model"
	"github.com/scorer/scorer/schema"
)

// Stack is everything between a decoded event and its scores: the
// ONNX Runtime environment and NVML (its Runtime), the model, the device
// pool and the transcript scorer. Open is the only way to build one, and so
// the only way from settings to a pool and a scorer: `run`, `score`,
// `bench`, `compare`, `doctor` and `gpu-proof` all build theirs with it,
// and differ only by Open's options.
type Stack struct {
	Model   *model.Model
	Pool    *gpupool.Pool
	Scorer  *fanout.TranscriptScorer
	Cache   *scorecache.Cache // nil when SCORE_CACHE_BYTES=0 or NoCache
	Labels  fanout.LabelConfig
	Limits  schema.Limits
	opts    options
	rt      *Runtime
	closers []func(context.Context) error
	// loading is the model while its hash and tokenizer load (openModel
	// to awaitModel); nil when WithModel gave it loaded.
	loading *model.Loading
	// graph is the CPU session's GRAPH_CACHE.
	graph graphCache
}

// Open starts the stack in dependency order, one step per component, each
// adding its closer: ONNX Runtime (unless OnRuntime gives it), the model
// (unless WithModel gives it), NVML and the pool, the score cache and the
// transcript scorer, all from cfg's settings (package config) and changed
// only as opts say. The model's hash and tokenizer load while the pool
// creates its sessions (model.Start), which on a production-size model
// hides both behind ORT's own load. A failed step closes what the earlier
// ones opened, in reverse, and returns its error.
func Open(ctx context.Context, cfg config.Config, log zerolog.Logger, reg prometheus.Registerer, opts ...Option) (*Stack, error) {
	s := &Stack{Labels: cfg.LabelConfig(), Limits: cfg.Limits()}
	for _, o := range opts {
		o(&s.opts)
	}
	for _, step := range []func(context.Context, config.Config, zerolog.Logger, prometheus.Registerer) error{
		s.openRuntime, s.openModel, s.openPool, s.awaitModel, s.openScorer,
	} {
		if err := step(ctx, cfg, log, reg); err != nil {
			// Undo what was opened; the error is what the caller needs.
			_ = s.Close(context.Background())
			return nil, err
		}
	}
	if s.loading != nil {
		// A stack that loaded its model is a scorer's own (run, score),
		// ready now: the graph cache is written for its next start.
		// Commands that open stacks on a model they loaded (bench,
		// doctor, compare) only read it.
		s.graph.start(cfg, log)
		s.closers = append(s.closers, func(ctx context.Context) error {
			s.graph.finish(ctx, cfg.GraphCacheWait, log)
			return nil
		})
	}
	return s, nil
}

// openRuntime starts the process's ONNX Runtime environment, or takes the
// Runtime OnRuntime gave (which its owner closes). Its closer runs last and
// leaves ORT and NVML loaded when the pool did not finish closing.
func (s *Stack) openRuntime(_ context.Context, cfg config.Config, log zerolog.Logger, _ prometheus.Registerer) error {
	if s.rt = s.opts.runtime; s.rt != nil {
		return nil
	}
	rt, err := StartRuntime(cfg.ORTLib, log)
	if err != nil {
		return err
	}
	s.rt = rt
	s.closers = append(s.closers, func(context.Context) error { return rt.Close() })
	return nil
}

// openModel reads the model's graph and starts hashing it and loading its
// tokenizer in the background, or takes the model WithModel gave; it holds
// nothing a closer must free (the sessions are the pool's).
func (s *Stack) openModel(_ context.Context, cfg config.Config, log zerolog.Logger, _ prometheus.Registerer) error {
	if s.opts.model != nil {
		s.Model = s.opts.model
		return nil
	}
	lo, err := cfg.ModelOptions()
	if err != nil {
		return err
	}
	if s.loading, err = model.Start(lo); err != nil {
		return err
	}
	m := s.loading.Model()
	log.Info().Str("model", m.Name).Str("graph_rewrite", m.GraphRewrite).Msg("model graph")
	return nil
}

// openPool opens NVML (once per Runtime) and the device pool. A pool that
// did not finish closing (ErrCloseIncomplete: a run or NVML call may still
// be going) or failed to close tells the Runtime, which then leaves NVML
// and ONNX Runtime loaded, since unloading them under a live call would
// crash the process, which is exiting anyway.
func (s *Stack) openPool(ctx context.Context, cfg config.Config, log zerolog.Logger, reg prometheus.Registerer) error {
	m := s.Model
	if s.loading != nil {
		m = s.loading.Model()
	}
	probe, err := s.rt.probeFor(ctx, cfg, log)
	if err != nil {
		return err
	}
	factory := s.graph.watch(gpupool.SessionFactory(m, cfg.SessionConfig(config.DetectHost())), log)
	if s.loading != nil {
		factory = afterLoad(s.loading, factory)
	}
	if s.opts.wrapEngines != nil {
		factory = s.opts.wrapEngines(factory)
	}
	extra := s.opts.pool
	if mem, _, err := cfg.CPUMemory(config.DetectHost()); err == nil && mem != nil && s.opts.cpuCachedOnly {
		mem.CachedOnly = true
		extra = append(extra, gpupool.CPUMemory(*mem))
	}
	pool, err := newPool(ctx, cfg, m, probe, log, reg, factory, extra...)
	if err != nil {
		if s.loading != nil {
			if _, lerr := s.loading.Wait(); lerr != nil {
				return lerr // why no engine opened
			}
		}
		return err
	}
	s.Pool = pool
	s.closers = append(s.closers, func(ctx context.Context) error {
		err := pool.Close(ctx)
		if err != nil {
			s.rt.poolUnfinished()
			msg := "the device pool closed with an error; skipping NVML and ONNX Runtime shutdown"
			if errors.Is(err, gpupool.ErrCloseIncomplete) {
				msg = "the device pool still has runs going; skipping NVML and ONNX Runtime shutdown (the process is exiting anyway)"
			}
			log.Warn().Err(err).Msg(msg)
		}
		return err
	})
	return nil
}

// awaitModel waits for the model's background load (every engine already
// has) and logs what was loaded.
func (s *Stack) awaitModel(_ context.Context, _ config.Config, log zerolog.Logger, _ prometheus.Registerer) error {
	if s.loading == nil {
		return nil
	}
	m, err := s.loading.Wait()
	if err != nil {
		return err
	}
	s.Model = m
	log.Info().Str("model", m.Name).Str("sha256", m.SHA256).Strs("inputs", m.InputNames).
		Strs("labels", m.ID2Label).Int("entailment_index", m.EntailmentIndex).Int("max_length", m.MaxLength).
		Str("score_mode", string(m.ScoreMode)).Str("pair_encoding", string(m.PairEncoding)).Msg("model loaded")
	return nil
}

// afterLoad returns factory's engines only once ld has finished loading:
// a session may be created from a model still loading, but the pool
// calibrates and runs it at once, and runs read the tokenizer.
func afterLoad(ld *model.Loading, factory gpupool.EngineFactory) gpupool.EngineFactory {
	return func(dev gpupool.Device) (gpupool.Engine, error) {
		eng, err := factory(dev)
		if err != nil {
			return nil, err
		}
		if _, err := ld.Wait(); err != nil {
			_ = eng.Close()
			return nil, err
		}
		return eng, nil
	}
}

// openScorer builds the score cache (SCORE_CACHE_BYTES, none at 0; or what
// NoCache and WithCache say) and the transcript scorer over the pool.
func (s *Stack) openScorer(_ context.Context, cfg config.Config, _ zerolog.Logger, reg prometheus.Registerer) error {
	var opts []fanout.ScorerOption
	switch {
	case s.opts.cacheSet:
		s.Cache = s.opts.cache
	case cfg.ScoreCacheBytes > 0:
		c, err := scorecache.New(int64(cfg.ScoreCacheBytes), reg)
		if err != nil {
			return err
		}
		s.Cache = c
	}
	if s.Cache != nil {
		opts = append(opts, fanout.WithCache(s.Cache))
	}
	var engine fanout.PairScorer = s.Pool
	if s.opts.wrapPairs != nil {
		engine = s.opts.wrapPairs(engine)
	}
	ts, err := fanout.NewTranscriptScorer(s.Model, s.Labels, engine, opts...)
	if err != nil {
		return err
	}
	s.Scorer = ts
	return nil
}

// Close releases the stack in reverse order of opening: the pool, then the
// Runtime Open started (not one OnRuntime gave), which stays loaded when
// the pool did not finish closing. ctx bounds the pool's drain
// (gpupool.Pool.Close).
func (s *Stack) Close(ctx context.Context) error {
	var errs []error
	for i := len(s.closers) - 1; i >= 0; i-- {
		errs = append(errs, s.closers[i](ctx))
	}
	s.closers = nil
	return errors.Join(errs...)
}
