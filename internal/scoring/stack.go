package scoring

import (
	"context"
	"errors"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/scorer/scorer/gpupool"
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
	// loading is the model while its hash and tokenizer load (openModel
	// to awaitModel).
	loading *model.Loading
	// poolUnfinished is set when the pool's Close failed: a terminated Run
	// or an NVML call may still be in flight, so NVML and ONNX Runtime
	// must stay loaded (the process is exiting anyway).
	poolUnfinished bool
}

// Open starts the stack in dependency order, one step per component, each
// adding its closer: ONNX Runtime, the model, NVML and the pool, the score
// cache and the transcript scorer. The model's hash and tokenizer load
// while the pool creates its sessions (model.Start), which on a
// production-size model hides both behind ORT's own load. A failed step closes what the earlier
// ones opened, in reverse, and returns its error.
func Open(ctx context.Context, cfg config.Config, log zerolog.Logger, reg prometheus.Registerer) (*Stack, error) {
	s := &Stack{Labels: cfg.LabelConfig(), Limits: cfg.Limits()}
	for _, step := range []func(context.Context, config.Config, zerolog.Logger, prometheus.Registerer) error{
		s.openORT, s.openModel, s.openPool, s.awaitModel, s.openScorer,
	} {
		if err := step(ctx, cfg, log, reg); err != nil {
			// Undo what was opened; the error is what the caller needs.
			_ = s.Close(context.Background())
			return nil, err
		}
	}
	return s, nil
}

// openORT starts the process's ONNX Runtime environment. Its closer leaves
// the library loaded when the pool did not finish closing: DestroyEnvironment
// dlcloses libonnxruntime under any Run still going, a crash instead of an
// exit.
func (s *Stack) openORT(_ context.Context, cfg config.Config, log zerolog.Logger, _ prometheus.Registerer) error {
	shutdown, err := InitORT(cfg.ORTLib)
	if err != nil {
		return err
	}
	s.closers = append(s.closers, func(context.Context) error {
		if s.poolUnfinished {
			log.Warn().Msg("leaving ONNX Runtime loaded: the pool did not finish closing (the process is exiting anyway)")
			return nil
		}
		return shutdown()
	})
	return nil
}

// openModel reads the model's graph and starts hashing it and loading its
// tokenizer in the background; it holds nothing a closer must free (the
// sessions are the pool's).
func (s *Stack) openModel(_ context.Context, cfg config.Config, log zerolog.Logger, _ prometheus.Registerer) error {
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

// openPool starts NVML and the device pool, with two closers: the pool's,
// and NVML's after it. A pool that did not finish closing (ErrCloseIncomplete:
// a run or NVML call may still be going) or failed to close leaves NVML and
// ONNX Runtime loaded, since unloading them under a live call would crash
// the process, which is exiting anyway.
func (s *Stack) openPool(ctx context.Context, cfg config.Config, log zerolog.Logger, reg prometheus.Registerer) error {
	m := s.loading.Model()
	wait := func(f gpupool.EngineFactory) gpupool.EngineFactory { return afterLoad(s.loading, f) }
	pool, closeNVML, err := NewPool(ctx, cfg, m, log, reg, wait)
	if err != nil {
		if _, lerr := s.loading.Wait(); lerr != nil {
			return lerr // why no engine opened
		}
		return err
	}
	s.Pool = pool
	s.closers = append(s.closers, func(context.Context) error {
		if s.poolUnfinished {
			log.Warn().Msg("leaving NVML initialised: the pool did not finish closing (the process is exiting anyway)")
			return nil
		}
		closeNVML()
		return nil
	}, func(ctx context.Context) error {
		err := pool.Close(ctx)
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
	return nil
}

// awaitModel waits for the model's background load (every engine already
// has) and logs what was loaded.
func (s *Stack) awaitModel(_ context.Context, _ config.Config, log zerolog.Logger, _ prometheus.Registerer) error {
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

// openScorer builds the score cache (SCORE_CACHE_BYTES; none at 0) and the
// transcript scorer over the pool.
func (s *Stack) openScorer(_ context.Context, cfg config.Config, _ zerolog.Logger, reg prometheus.Registerer) error {
	var opts []model.ScorerOption
	if cfg.ScoreCacheBytes > 0 {
		c, err := scorecache.New(int64(cfg.ScoreCacheBytes), reg)
		if err != nil {
			return err
		}
		s.Cache = c
		opts = append(opts, model.WithCache(c))
	}
	ts, err := model.NewTranscriptScorer(s.Model, s.Labels, s.Pool, opts...)
	if err != nil {
		return err
	}
	s.Scorer = ts
	return nil
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
