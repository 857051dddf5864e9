// Package measure is the timing and the agreement maths that the
// subcommands which measure a scorer share: `scorer compare`, `scorer
// doctor`, `scorer gpu-proof bench` and `scorer bench`. Scoring runs in
// chunks, timed by the wall clock and the process's CPU time (Chunks);
// a call repeated for a while (Repeat); two sides' scores of the same pairs
// lined up (Tally). It knows nothing of models or pools: callers hand it
// their own score functions, so it sits below every one of them.
package measure

import (
	"context"
	"syscall"
	"time"
)

// Run is a timed scoring run: the results of the items it got to, in
// order, and how long it took.
type Run[R any] struct {
	Results []R
	// Done is how many items were scored.
	Done int
	// Wall is the run's wall time, CPU the process's user and system CPU
	// time meanwhile (all threads: on a machine shared with other work it
	// moves far less than Wall).
	Wall, CPU time.Duration
}

// Chunks scores items in order, one call of score per chunk, and times the
// whole run. next says how many items the next call takes, given how many
// are done and the wall time so far (clamped to what is left); 0 or less
// stops the run early. On an error it returns the run so far with it.
func Chunks[T, R any](ctx context.Context, items []T, next func(done int, elapsed time.Duration) int,
	score func(context.Context, []T) ([]R, error)) (Run[R], error) {
	var r Run[R]
	start, cpu0 := time.Now(), CPUTime()
	for r.Done < len(items) {
		n := min(next(r.Done, time.Since(start)), len(items)-r.Done)
		if n <= 0 {
			break
		}
		out, err := score(ctx, items[r.Done:r.Done+n])
		if err != nil {
			r.Wall, r.CPU = time.Since(start), CPUTime()-cpu0
			return r, err
		}
		r.Results = append(r.Results, out...)
		r.Done += n
	}
	r.Wall, r.CPU = time.Since(start), CPUTime()-cpu0
	return r, nil
}

// Every is a Chunks next that takes chunk items a call (at least one).
func Every(chunk int) func(int, time.Duration) int {
	return func(int, time.Duration) int { return max(chunk, 1) }
}

// Repeat calls call until d has passed and at least minCalls calls have
// ended, or ctx ends (checked between calls: a caller that must fail on it
// checks ctx.Err after), and returns each call's duration and the wall time
// from the first call's start to the last's end. A call's error ends the
// run and is returned with the calls that ended before it; the time
// includes the failed call.
func Repeat(ctx context.Context, d time.Duration, minCalls int, call func(context.Context) error) ([]time.Duration, time.Duration, error) {
	var calls []time.Duration
	start := time.Now()
	for (time.Since(start) < d || len(calls) < minCalls) && ctx.Err() == nil {
		t0 := time.Now()
		if err := call(ctx); err != nil {
			return calls, time.Since(start), err
		}
		calls = append(calls, time.Since(t0))
	}
	return calls, time.Since(start), nil
}

// CPUTime is this process's user+system CPU time so far (0 where the
// system cannot say).
func CPUTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
