package service

import (
	"sync"
	"time"
)

// progressWatch tells a wedged pipeline or a stuck record from a busy one,
// for /healthz. It fails on any of:
//
//   - work waiting (records in flight) and nothing moved, no inference
//     batch finished and nothing published or dead-lettered, for longer
//     than limit: a deadlock, a pool that fails every batch, a producer
//     stuck on a broken connection;
//   - one inference run going on for longer than limit (stuck's "an
//     inference run"): a driver call or a run that ignores cancellation,
//     which other devices' progress would otherwise hide;
//   - one record's acknowledgement (its result or dead letter written and
//     retried once its turn came) going on for longer than limit (stuck's
//     "a record's publish or dead letter"): a dead letter the DLQ refuses,
//     a result the broker keeps rejecting. That record holds its
//     partition's commits back while others move, and a restart (with its
//     redelivery) is the remedy liveness offers.
//
// A long transcript is none of these: its inference batches keep finishing
// (each bounded by the batch caps), and the time it spends being scored or
// waiting for an earlier batch of its partition is not an acknowledgement.
// An idle scorer is never stalled. The orchestrator restarts a failing pod,
// and its uncommitted records are redelivered.
type progressWatch struct {
	limit time.Duration
	// sample returns a counter that grows with any progress, and whether
	// work is waiting.
	sample func() (progress uint64, pending bool)
	// stuck returns the age of the oldest thing that should have finished
	// (an inference run, a record's acknowledgement; 0 when none) and what
	// it is; nil means not checked.
	stuck func() (age time.Duration, what string)
	now   func() time.Time

	mu       sync.Mutex
	started  bool
	last     uint64
	lastMove time.Time
}

// stalled reports whether the pipeline has had work waiting and made no
// progress for longer than the limit, or something that should have
// finished has gone on longer than the limit, for how long, and which
// (why). It is evaluated at each call (the liveness probe's period), which
// is enough: any progress between two calls shows as a changed counter.
func (w *progressWatch) stalled() (stalled bool, since time.Duration, why string) {
	progress, pending := w.sample()
	now := w.now()
	if w.stuck != nil {
		if age, what := w.stuck(); age > w.limit {
			return true, age, what
		}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.started || progress != w.last || !pending {
		w.started, w.last, w.lastMove = true, progress, now
		return false, 0, ""
	}
	since = now.Sub(w.lastMove)
	return since > w.limit, since, "no progress with records in flight"
}

// Reasons progressWatch.stuck gives.
const (
	stuckRun    = "an inference run"
	stuckRecord = "a record's publish or dead letter"
)

// oldestStuck is progressWatch.stuck over the pool's oldest run and the
// consumer's oldest acknowledgement: the older of the two, and which.
func oldestStuck(run, ack time.Duration) (time.Duration, string) {
	if run > ack {
		return run, stuckRun
	}
	return ack, stuckRecord
}
