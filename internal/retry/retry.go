// Package retry is the pipeline's one backoff: the pause between the tries
// of a retry loop, doubled after each pause up to a bound, jittered where
// many replicas retry the same failure, and cut short when the loop's
// context ends. The consumer (scoring, publishing, dead letters, fetching),
// the producer (writes) and internal/streaming (readying the topics) retry
// through it. It imports nothing of the module, which is what lets
// consumer and producer, who may otherwise import only schema, use it.
package retry

import (
	"context"
	"math/rand/v2"
	"time"
)

// Backoff is the pause schedule of one retry loop. Make one per loop run
// (it is not safe for concurrent use) with New or Jittered.
type Backoff struct {
	first, max, pause time.Duration
	jitter            bool
}

// New returns a Backoff whose first pause is first and each next one twice
// the last, never more than max.
func New(first, max time.Duration) *Backoff {
	return &Backoff{first: first, max: max, pause: first}
}

// Jittered is New with each pause drawn at random from [p/2, 3p/2) around
// its nominal p, so that many replicas failing at the same moment (a broker
// restarting under all of them) do not retry in lockstep.
func Jittered(first, max time.Duration) *Backoff {
	b := New(first, max)
	b.jitter = true
	return b
}

// Pause is the nominal pause the next Wait takes, for the log line that
// announces it.
func (b *Backoff) Pause() time.Duration { return b.pause }

// Wait sleeps the current pause, or until ctx ends, and doubles the pause
// for next time (up to the bound). It reports whether it slept fully: false
// means ctx ended and the loop should stop.
func (b *Backoff) Wait(ctx context.Context) bool {
	return Sleep(ctx, b.next())
}

// next returns the pause to sleep now (jittered, when b is) and doubles
// the nominal one.
func (b *Backoff) next() time.Duration {
	d := b.pause
	if b.jitter && d > 0 {
		d = time.Duration(rand.Int64N(int64(d))) + d/2
	}
	b.pause = min(b.pause*2, b.max)
	return d
}

// Reset starts the schedule again from the first pause, after a success
// in a loop that keeps running.
func (b *Backoff) Reset() { b.pause = b.first }

// Do calls try until it returns nil, returns an error permanent says
// retrying cannot fix, has been called tries times (tries <= 0: no bound),
// or ctx ends. Before each next try it calls retrying (when not nil) with
// the number of the try that failed and its error, then waits b. It returns
// nil on success and otherwise the last try's error, or ctx's error when
// ctx ended during a pause; a caller tells an ended ctx by ctx.Err().
func Do(ctx context.Context, b *Backoff, tries int, permanent func(error) bool, retrying func(try int, err error), try func() error) error {
	for n := 1; ; n++ {
		err := try()
		if err == nil {
			return nil
		}
		if ctx.Err() != nil || permanent(err) || tries > 0 && n >= tries {
			return err
		}
		if retrying != nil {
			retrying(n, err)
		}
		if !b.Wait(ctx) {
			return ctx.Err()
		}
	}
}

// Sleep sleeps d or until ctx ends; it reports whether it slept fully.
func Sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
