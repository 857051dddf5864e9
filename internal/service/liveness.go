package service

import (
	"sync"
	"time"
)

// progressWatch tells a wedged pipeline from a busy one, for /healthz: work
// is waiting (records in flight) and nothing has moved — no inference batch
// finished, nothing published or dead-lettered — for longer than limit. A
// hung run that ignored cancellation or a deadlock then fails liveness and
// the orchestrator restarts the pod (the uncommitted records are
// redelivered); a long transcript is not a stall, because its inference
// batches keep finishing. An idle scorer is never stalled.
//
// Progress elsewhere does not hide one stuck record: when the oldest
// fetched record not yet acknowledged (a dead letter that can never be
// written, a publish that keeps failing) is older than limit, the watch
// fails too, although other batches keep moving: that record holds its
// partition's commits back, and a restart (with its redelivery) is the
// remedy liveness offers.
type progressWatch struct {
	limit time.Duration
	// sample returns a counter that grows with any progress, and whether
	// work is waiting.
	sample func() (progress uint64, pending bool)
	// oldest returns the age of the oldest unacknowledged record (0: none);
	// nil means not checked.
	oldest func() time.Duration
	now    func() time.Time

	mu       sync.Mutex
	started  bool
	last     uint64
	lastMove time.Time
}

// stalled reports whether the pipeline has had work waiting and made no
// progress for longer than the limit, or its oldest unacknowledged record
// is older than the limit, for how long, and which of the two (why). It is
// evaluated at each call (the liveness probe's period), which is enough:
// any progress between two calls shows as a changed counter.
func (w *progressWatch) stalled() (stalled bool, since time.Duration, why string) {
	progress, pending := w.sample()
	now := w.now()
	if w.oldest != nil {
		if age := w.oldest(); age > w.limit {
			return true, age, "oldest unacknowledged record"
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
