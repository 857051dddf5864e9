package measure

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"
)

// double is a score function: each item twice, recording its calls.
type double struct{ calls [][]int }

func (d *double) score(_ context.Context, items []int) ([]int, error) {
	d.calls = append(d.calls, slices.Clone(items))
	out := make([]int, len(items))
	for i, x := range items {
		out[i] = 2 * x
	}
	return out, nil
}

// TestChunks: items go to score in order, chunk at a time with the last
// chunk short; next sees what is done and can stop the run early; an error
// returns the run so far with it.
func TestChunks(t *testing.T) {
	items := []int{1, 2, 3, 4, 5, 6, 7}
	var d double
	run, err := Chunks(t.Context(), items, Every(3), d.score)
	if err != nil || !slices.Equal(run.Results, []int{2, 4, 6, 8, 10, 12, 14}) || run.Done != 7 || len(d.calls) != 3 || len(d.calls[2]) != 1 {
		t.Fatalf("Every(3): %+v, calls %v, %v", run, d.calls, err)
	}
	if run.Wall <= 0 {
		t.Errorf("wall time %v", run.Wall)
	}

	d = double{}
	var seen []int
	run, err = Chunks(t.Context(), items, func(done int, _ time.Duration) int {
		seen = append(seen, done)
		if done == 0 {
			return 1
		}
		if done >= 3 {
			return 0
		}
		return 2
	}, d.score)
	if err != nil || !slices.Equal(run.Results, []int{2, 4, 6}) || !slices.Equal(seen, []int{0, 1, 3}) {
		t.Fatalf("a next that stops at 3: %+v, next saw %v, %v", run, seen, err)
	}

	boom := errors.New("boom")
	calls := 0
	run, err = Chunks(t.Context(), items, Every(2), func(ctx context.Context, xs []int) ([]int, error) {
		if calls++; calls == 2 {
			return nil, boom
		}
		return xs, nil
	})
	if !errors.Is(err, boom) || !slices.Equal(run.Results, []int{1, 2}) || run.Done != 2 {
		t.Fatalf("an error in the second call: %+v, %v", run, err)
	}
}

// TestRepeat: at least minCalls calls however short d is; none after the
// context ends; a call's error ends the run with the calls before it.
func TestRepeat(t *testing.T) {
	n := 0
	calls, elapsed, err := Repeat(t.Context(), 0, 3, func(context.Context) error { n++; return nil })
	if err != nil || len(calls) != 3 || n != 3 || elapsed < calls[0] {
		t.Fatalf("d 0, at least 3: %d calls %v in %v, %v", n, calls, elapsed, err)
	}

	ctx, cancel := context.WithCancel(t.Context())
	n = 0
	calls, _, err = Repeat(ctx, time.Hour, 100, func(context.Context) error {
		if n++; n == 2 {
			cancel()
		}
		return nil
	})
	if err != nil || len(calls) != 2 {
		t.Fatalf("cancelled in the second call: %d calls, %v", len(calls), err)
	}

	boom := errors.New("boom")
	n = 0
	calls, _, err = Repeat(t.Context(), time.Hour, 0, func(context.Context) error {
		if n++; n == 3 {
			return boom
		}
		return nil
	})
	if !errors.Is(err, boom) || len(calls) != 2 {
		t.Fatalf("an error in the third call: %d calls, %v", len(calls), err)
	}
}

// TestTally: decisions above the threshold, who flags a pair alone, |Δp|
// kept in order, and agreement 1 over no pairs.
func TestTally(t *testing.T) {
	tl := Tally{Threshold: 0.5, KeepDiffs: true}
	flips := []bool{
		tl.Add(0.9, 0.8), // both match
		tl.Add(0.6, 0.4), // A alone
		tl.Add(0.1, 0.5), // B at the threshold: not a match
		tl.Add(0.3, 0.7), // B alone
	}
	if !slices.Equal(flips, []bool{false, true, false, true}) {
		t.Errorf("flips %v", flips)
	}
	if tl.Pairs != 4 || tl.Agree != 2 || tl.OnlyA != 1 || tl.OnlyB != 1 || tl.Agreement() != 0.5 {
		t.Errorf("tally %+v, agreement %v", tl, tl.Agreement())
	}
	want := []float64{0.1, 0.2, 0.4, 0.4}
	for i, d := range tl.Diffs {
		if d < want[i]-1e-6 || d > want[i]+1e-6 {
			t.Errorf("diff %d: %v, want %v", i, d, want[i])
		}
	}
	if tl.MaxAbsDiff != slices.Max(tl.Diffs) {
		t.Errorf("max %v of %v", tl.MaxAbsDiff, tl.Diffs)
	}
	if e := (&Tally{}).Agreement(); e != 1 {
		t.Errorf("agreement over no pairs %v, want 1", e)
	}
	sorted := []float64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	if Quantile(sorted, 0.5) != 5 || Quantile(sorted, 0.99) != 10 || Quantile(sorted, 0) != 1 {
		t.Errorf("quantiles %v %v %v", Quantile(sorted, 0.5), Quantile(sorted, 0.99), Quantile(sorted, 0))
	}
}
