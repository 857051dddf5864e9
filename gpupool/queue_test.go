package gpupool

import (
	"slices"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// TestQueue runs the queue through the moves the pool makes and checks
// order, pair counts and the depth gauge after each.
func TestQueue(t *testing.T) {
	depth := prometheus.NewGauge(prometheus.GaugeOpts{Name: "depth"})
	q := newQueue(depth)
	live, ended := &request{}, &request{finished: true}
	mk := func(req *request, rows int, avoid ...int) *batch {
		return &batch{req: req, idx: make([]int, rows), avoid: avoid}
	}
	a, b, c, d := mk(live, 4), mk(ended, 2), mk(live, 3, 0), mk(live, 1)
	check := func(step string, want ...*batch) {
		t.Helper()
		pairs := 0
		for _, w := range want {
			pairs += len(w.idx)
		}
		if got := q.snapshot(); !slices.Equal(got, want) || q.len() != len(want) {
			t.Errorf("%s: queue %v, want %v", step, got, want)
		}
		if q.pairs != pairs || metricValue(t, depth) != float64(pairs) {
			t.Errorf("%s: %d pairs (gauge %v), want %d", step, q.pairs, metricValue(t, depth), pairs)
		}
	}

	q.push(a)
	q.push(b)
	q.pushFront(c) // a retry goes before new work
	check("push, push, pushFront", c, a, b)

	// take: the first batch the predicate accepts, here one not to avoid
	// device slot 0; the others keep their order.
	got, ok := q.take(func(x *batch) bool { return !slices.Contains(x.avoid, 0) })
	if !ok || got != a {
		t.Fatalf("take = %v, %v; want a", got, ok)
	}
	check("take", c, b)
	if got, ok := q.take(func(*batch) bool { return false }); ok || got != nil {
		t.Errorf("take with no match = %v, %v", got, ok)
	}
	check("take with no match", c, b)

	// dropFinished: the batches of calls that ended, and only those.
	q.push(d)
	if dropped := q.dropFinished(); !slices.Equal(dropped, []*batch{b}) {
		t.Errorf("dropFinished = %v, want [b]", dropped)
	}
	check("dropFinished", c, d)
	if dropped := q.dropFinished(); len(dropped) != 0 {
		t.Errorf("second dropFinished = %v, want none", dropped)
	}

	// remove: a failed call's batches go, in order.
	if removed := q.remove(func(x *batch) bool { return x.req == live }); !slices.Equal(removed, []*batch{c, d}) {
		t.Errorf("remove = %v, want [c d]", removed)
	}
	check("remove", []*batch{}...)
}
