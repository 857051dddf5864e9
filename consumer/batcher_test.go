package consumer

import (
	"math/rand/v2"
	"testing"
	"time"
)

type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time          { return c.t }
func (c *fakeClock) advance(d time.Duration) { c.t = c.t.Add(d) }

func newTestBatcher(pol BatchPolicy) (*Batcher[int], *fakeClock) {
	clk := &fakeClock{t: time.Unix(1000, 0)}
	b := NewBatcher(pol, func(n int) int { return n })
	b.now = clk.now
	return b, clk
}

// feed mimics the owning loop: flush before an overflowing add, and after an
// add that asks for it. It returns the flushed batches and their triggers.
func feed(b *Batcher[int], sizes []int) ([][]int, []Trigger) {
	var out [][]int
	var why []Trigger
	for _, s := range sizes {
		if b.WouldOverflow(s) {
			batch, tr := b.Flush()
			out, why = append(out, batch), append(why, tr)
		}
		if b.Add(s) {
			batch, tr := b.Flush()
			out, why = append(out, batch), append(why, tr)
		}
	}
	if batch, tr := b.Flush(); batch != nil {
		out, why = append(out, batch), append(why, tr)
	}
	return out, why
}

func TestBatcherRules(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		pol     BatchPolicy
		sizes   []int
		batches [][]int
		why     []Trigger
	}{
		{"count", BatchPolicy{MaxMessages: 2, MaxBytes: 100}, []int{1, 1, 1, 1, 1},
			[][]int{{1, 1}, {1, 1}, {1}}, []Trigger{TriggerCount, TriggerCount, TriggerForced}},
		{"bytes exact", BatchPolicy{MaxMessages: 10, MaxBytes: 10}, []int{4, 6, 3},
			[][]int{{4, 6}, {3}}, []Trigger{TriggerBytes, TriggerForced}},
		{"overflow flushes before add", BatchPolicy{MaxMessages: 10, MaxBytes: 10}, []int{4, 4, 4},
			[][]int{{4, 4}, {4}}, []Trigger{TriggerBytes, TriggerForced}},
		{"oversized alone", BatchPolicy{MaxMessages: 10, MaxBytes: 10}, []int{3, 25, 2},
			[][]int{{3}, {25}, {2}}, []Trigger{TriggerBytes, TriggerBytes, TriggerForced}},
		{"no byte bound", BatchPolicy{MaxMessages: 3}, []int{100, 200, 300, 400},
			[][]int{{100, 200, 300}, {400}}, []Trigger{TriggerCount, TriggerForced}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b, _ := newTestBatcher(tc.pol)
			got, why := feed(b, tc.sizes)
			if len(got) != len(tc.batches) {
				t.Fatalf("batches = %v, want %v", got, tc.batches)
			}
			for i := range got {
				if len(got[i]) != len(tc.batches[i]) || why[i] != tc.why[i] {
					t.Fatalf("batch %d = %v (%v), want %v (%v)", i, got[i], why[i], tc.batches[i], tc.why[i])
				}
				for j := range got[i] {
					if got[i][j] != tc.batches[i][j] {
						t.Fatalf("batch %d = %v, want %v", i, got[i], tc.batches[i])
					}
				}
			}
		})
	}
}

func TestBatcherMaxWaitFromOldest(t *testing.T) {
	t.Parallel()
	b, clk := newTestBatcher(BatchPolicy{MaxMessages: 100, MaxWait: 200 * time.Millisecond})
	if d := b.UntilNext(clk.now()); d >= 0 {
		t.Fatalf("empty batch UntilNext = %v, want negative", d)
	}
	b.Add(1)
	clk.advance(150 * time.Millisecond)
	// A newer message must not restart the clock.
	if b.Add(2) {
		t.Fatal("flush before MaxWait")
	}
	if d := b.UntilNext(clk.now()); d != 50*time.Millisecond {
		t.Fatalf("UntilNext = %v, want 50ms", d)
	}
	clk.advance(60 * time.Millisecond)
	if d := b.UntilNext(clk.now()); d != 0 {
		t.Fatalf("UntilNext overdue = %v, want 0", d)
	}
	batch, why := b.Flush()
	if len(batch) != 2 || why != TriggerPeriod {
		t.Fatalf("flush = %v %v", batch, why)
	}
	// Add itself notices an overdue batch.
	b.Add(1)
	clk.advance(time.Second)
	if !b.Add(2) {
		t.Fatal("Add after MaxWait should ask for a flush")
	}
	if _, why := b.Flush(); why != TriggerPeriod {
		t.Fatalf("trigger = %v", why)
	}
	if got := b.Triggers()[TriggerPeriod]; got != 2 {
		t.Fatalf("period triggers = %d, want 2", got)
	}
}

// TestBatcherBoundsRandom checks the invariants on random input: no batch
// over MaxMessages, none over MaxBytes unless it is one oversized message,
// nothing lost or reordered.
func TestBatcherBoundsRandom(t *testing.T) {
	t.Parallel()
	for seed := range uint64(100) {
		r := rand.New(rand.NewPCG(seed, 3))
		pol := BatchPolicy{MaxMessages: 1 + r.IntN(8), MaxBytes: 1 + r.IntN(50)}
		sizes := make([]int, r.IntN(100))
		for i := range sizes {
			sizes[i] = r.IntN(60)
		}
		b, _ := newTestBatcher(pol)
		got, _ := feed(b, sizes)
		var flat []int
		for _, batch := range got {
			sum := 0
			for _, s := range batch {
				sum += s
			}
			if len(batch) == 0 || len(batch) > pol.MaxMessages {
				t.Fatalf("seed %d: batch %v breaks MaxMessages %d", seed, batch, pol.MaxMessages)
			}
			if sum > pol.MaxBytes && len(batch) != 1 {
				t.Fatalf("seed %d: batch %v (%d bytes) breaks MaxBytes %d", seed, batch, sum, pol.MaxBytes)
			}
			flat = append(flat, batch...)
		}
		if len(flat) != len(sizes) {
			t.Fatalf("seed %d: %d in, %d out", seed, len(sizes), len(flat))
		}
		for i := range flat {
			if flat[i] != sizes[i] {
				t.Fatalf("seed %d: reordered", seed)
			}
		}
	}
}
