package consumer

import (
	"math/rand/v2"
	"sync"
	"testing"
)

// wmTester drives a Watermark through a script of steps, in the style of
// Jeffail/checkpoint's tester.
type wmTester struct {
	t     *testing.T
	w     *Watermark
	dones map[int64]func()
}

func newWMTester(t *testing.T) *wmTester {
	return &wmTester{t: t, w: NewWatermark(), dones: map[int64]func(){}}
}

func (x *wmTester) track(offsets ...int64) *wmTester {
	x.t.Helper()
	for _, o := range offsets {
		d, err := x.w.Track(o)
		if err != nil {
			x.t.Fatalf("track %d: %v", o, err)
		}
		x.dones[o] = d
	}
	return x
}

func (x *wmTester) resolve(offsets ...int64) *wmTester {
	x.t.Helper()
	for _, o := range offsets {
		d, ok := x.dones[o]
		if !ok {
			x.t.Fatalf("resolve %d: not tracked", o)
		}
		d()
	}
	return x
}

func (x *wmTester) want(next int64, ok bool) *wmTester {
	x.t.Helper()
	gotNext, gotOK := x.w.Committable()
	if gotOK != ok || (ok && gotNext != next) {
		x.t.Fatalf("committable = (%d, %v), want (%d, %v)", gotNext, gotOK, next, ok)
	}
	return x
}

func TestWatermarkScripts(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		script func(x *wmTester)
	}{
		{"nothing tracked", func(x *wmTester) { x.want(0, false) }},
		{"tracked but unresolved", func(x *wmTester) { x.track(1, 2, 3).want(0, false) }},
		{"sequential", func(x *wmTester) {
			x.track(1, 2, 3).resolve(1).want(2, true).resolve(2).want(3, true).resolve(3).want(4, true)
		}},
		{"track 1..5, resolve 3,1,2 → 4", func(x *wmTester) {
			x.track(1, 2, 3, 4, 5).resolve(3).want(0, false).resolve(1).want(2, true).resolve(2).want(4, true)
		}},
		{"gap holds back", func(x *wmTester) {
			x.track(10, 11, 12, 13).resolve(11, 12, 13).want(0, false).resolve(10).want(14, true)
		}},
		{"reverse order", func(x *wmTester) {
			x.track(0, 1, 2, 3).resolve(3, 2, 1).want(0, false).resolve(0).want(4, true)
		}},
		{"compacted offsets", func(x *wmTester) {
			x.track(5, 9, 20).resolve(9).want(0, false).resolve(5).want(10, true).resolve(20).want(21, true)
		}},
		{"track after drain", func(x *wmTester) {
			x.track(1, 2).resolve(1, 2).want(3, true).track(3, 4).resolve(4).want(3, true).resolve(3).want(5, true)
		}},
		{"double resolve is harmless", func(x *wmTester) {
			x.track(1, 2).resolve(2, 2).want(0, false).resolve(1, 1).want(3, true)
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.script(newWMTester(t))
		})
	}
}

func TestWatermarkRejectsNonIncreasing(t *testing.T) {
	t.Parallel()
	w := NewWatermark()
	if _, err := w.Track(5); err != nil {
		t.Fatal(err)
	}
	for _, o := range []int64{5, 4} {
		if _, err := w.Track(o); err == nil {
			t.Fatalf("Track(%d) after 5: want error", o)
		}
	}
}

func TestWatermarkPending(t *testing.T) {
	t.Parallel()
	x := newWMTester(t).track(1, 2, 3).resolve(2)
	if got := x.w.Pending(); got != 2 {
		t.Fatalf("pending = %d, want 2", got)
	}
	x.resolve(1, 3)
	if got := x.w.Pending(); got != 0 {
		t.Fatalf("pending = %d, want 0", got)
	}
}

// TestWatermarkRandomOrder resolves offsets in random order, concurrently,
// and checks after every step that Committable is exactly one past the
// longest resolved prefix: never past a gap, never behind.
func TestWatermarkRandomOrder(t *testing.T) {
	t.Parallel()
	for seed := range uint64(50) {
		r := rand.New(rand.NewPCG(seed, seed*7+1))
		n := 1 + r.IntN(200)
		w := NewWatermark()
		offsets := make([]int64, n)
		dones := make([]func(), n)
		off := int64(r.IntN(1000))
		for i := range n {
			off += 1 + int64(r.IntN(3)) // gaps, as on a compacted topic
			offsets[i] = off
			d, err := w.Track(off)
			if err != nil {
				t.Fatal(err)
			}
			dones[i] = d
		}
		resolved := make([]bool, n)
		for _, i := range r.Perm(n) {
			dones[i]()
			resolved[i] = true
			prefix := 0
			for prefix < n && resolved[prefix] {
				prefix++
			}
			next, ok := w.Committable()
			if prefix == 0 {
				if ok {
					t.Fatalf("seed %d: committable %d with offset %d unresolved", seed, next, offsets[0])
				}
				continue
			}
			if !ok || next != offsets[prefix-1]+1 {
				t.Fatalf("seed %d: committable (%d,%v), want %d", seed, next, ok, offsets[prefix-1]+1)
			}
		}
	}
	// Concurrent resolvers: the race detector checks the locking and the
	// final value must cover everything.
	w := NewWatermark()
	var dones []func()
	for o := range int64(1000) {
		d, _ := w.Track(o)
		dones = append(dones, d)
	}
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := g; i < len(dones); i += 4 {
				dones[i]()
			}
		})
	}
	wg.Wait()
	if next, ok := w.Committable(); !ok || next != 1000 {
		t.Fatalf("committable = (%d,%v), want 1000", next, ok)
	}
}
