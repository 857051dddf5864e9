package consumer

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"

	"github.com/scorer/scorer/internal/retry"
	"github.com/scorer/scorer/schema"
)

// scoreStage is the processor's scoring stage (schema.StageScore): it
// scores the events through the Scorer and returns one result per event;
// failed[i] is set for each event to dead-letter instead. ok is false if
// ctx ended first.
//
// The batch is scored with ScoreAttempts tries; if it keeps failing, its
// events are scored one by one. An event is dead-lettered only when its
// error is permanent (see permanentScoreError) or its failure is isolated:
// the scorer scored another event (the canary, normally one of this batch)
// after the failure. When everything fails alike the scorer is down (GPU
// lost or out of memory under contention, pool closed): the events are kept
// and retried in rounds with bounded exponential backoff, each round logged
// at error level, for as long as ctx lives — an outage must not turn the
// stream into dead letters.
func (pr *processor) scoreStage(ctx context.Context, events []schema.TranscriptEvent) (results []schema.ScoredTranscript, failed map[int]error, ok bool) {
	results = make([]schema.ScoredTranscript, len(events))
	failed = map[int]error{}
	todo := make([]int, len(events)) // indexes of events still to score
	for i := range todo {
		todo[i] = i
	}
	backoff := retry.New(pr.cfg.RetryBackoff, pr.cfg.OutageBackoffMax)
	for round := 1; ; round++ {
		batch := make([]schema.TranscriptEvent, len(todo))
		for k, i := range todo {
			batch[k] = events[i]
		}
		res, err := pr.scoreWithRetry(ctx, batch)
		if err == nil {
			for k, i := range todo {
				results[i] = res[k]
			}
			return results, failed, true
		}
		if ctx.Err() != nil {
			return nil, nil, false
		}
		// Already in an outage: probe before scoring events one by one.
		healthy := round == 1 || pr.probe(ctx)
		var lastErr error
		if healthy {
			errs := map[int]error{}
			if len(todo) == 1 {
				errs[todo[0]] = err
			} else {
				pr.log.Warn().Err(err).Int("events", len(todo)).Msg("batch scoring failed; scoring events one by one")
				for _, i := range todo {
					one, err := pr.scoreWithRetry(ctx, events[i:i+1])
					if ctx.Err() != nil {
						return nil, nil, false
					}
					if err != nil {
						errs[i] = err
						continue
					}
					results[i] = one[0]
				}
			}
			var still []int
			for _, i := range todo {
				switch e := errs[i]; {
				case e == nil:
				case permanentScoreError(e):
					failed[i] = e
				default:
					still = append(still, i)
					lastErr = e
				}
			}
			todo = still
			if len(todo) == 0 {
				return results, failed, true
			}
			if pr.probe(ctx) {
				// The scorer works: these events fail on their own.
				for _, i := range todo {
					failed[i] = errs[i]
				}
				return results, failed, true
			}
		}
		if ctx.Err() != nil {
			return nil, nil, false
		}
		if lastErr == nil {
			lastErr = err
		}
		pr.m.outages.Inc()
		pr.log.Error().Err(lastErr).Int("events", len(todo)).Int("round", round).Dur("retry_in", backoff.Pause()).
			Msg("scorer fails for every event; keeping the batch and retrying (nothing is dead-lettered during an outage)")
		if !backoff.Wait(ctx) {
			return nil, nil, false
		}
	}
}

// permanentScoreError reports whether a scoring error says the event itself
// is bad, so retrying cannot help: the error (or one it wraps) has a
// Permanent() method returning true — the contract for scorers' invalid-
// input errors — or it wraps schema.ErrInvalidEvent.
func permanentScoreError(err error) bool {
	return IsPermanent(err) || errors.Is(err, schema.ErrInvalidEvent)
}

// probe reports whether the scorer works right now: the canary event scores.
// With no canary yet there is no evidence either way, and it reports false.
func (pr *processor) probe(ctx context.Context) bool {
	ev := pr.canary.Load()
	if ev == nil {
		return false
	}
	_, err := pr.scoreWithRetry(ctx, []schema.TranscriptEvent{*ev})
	return err == nil
}

// scoreWithRetry scores events with up to ScoreAttempts tries, stopping
// early on a permanent error. On success it keeps the call's smallest event
// as the canary.
func (pr *processor) scoreWithRetry(ctx context.Context, events []schema.TranscriptEvent) ([]schema.ScoredTranscript, error) {
	// The first pause is twice RetryBackoff: the loop this replaced doubled
	// its pause before the first wait, and the schedule is kept as it was.
	backoff := retry.New(min(2*pr.cfg.RetryBackoff, pr.cfg.RetryBackoffMax), pr.cfg.RetryBackoffMax)
	var res []schema.ScoredTranscript
	err := retry.Do(ctx, backoff, pr.cfg.ScoreAttempts, permanentScoreError, nil, func() error {
		var err error
		res, err = pr.scoreGuarded(ctx, events)
		if err == nil && len(res) != len(events) {
			err = fmt.Errorf("scorer returned %d results for %d events", len(res), len(events))
		}
		return err
	})
	if err == nil {
		small := 0
		for i := range events {
			if events[i].SentenceCount() < events[small].SentenceCount() {
				small = i
			}
		}
		ev := events[small]
		pr.canary.Store(&ev)
		return res, nil
	}
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	return nil, fmt.Errorf("consumer: score %d events: %w", len(events), err)
}

// scoreGuarded is Scorer.Score with a panic turned into an error: the
// failure then goes through the same isolation as any other (the events
// that trip it are dead-lettered, the rest score).
func (pr *processor) scoreGuarded(ctx context.Context, events []schema.TranscriptEvent) (res []schema.ScoredTranscript, err error) {
	defer func() {
		if p := recover(); p != nil {
			pr.log.Error().Str("stack", string(debug.Stack())).Int("events", len(events)).Msgf("scorer panicked: %v", p)
			err = fmt.Errorf("consumer: scoring %d events: %w: %v", len(events), errPanic, p)
		}
	}()
	return pr.scorer.Score(ctx, events)
}
