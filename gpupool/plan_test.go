package gpupool

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

func TestPlanBatchesRespectsBudgetAndCoversEveryPair(t *testing.T) {
	cases := []struct {
		name              string
		lens              []int
		maxTokens, maxRow int
	}{
		{"empty", nil, 100, 10},
		{"one", []int{7}, 100, 10},
		{"rows cap", []int{1, 1, 1, 1, 1, 1, 1}, 1000, 3},
		{"token cap", []int{10, 10, 10, 10, 10}, 25, 100},
		{"oversize alone", []int{5, 500, 5, 6}, 100, 100},
		{"zero length", []int{0, 0, 3}, 4, 10},
		{"mixed", []int{30, 2, 17, 99, 4, 4, 61, 8, 12, 50}, 120, 4},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			pairs := makePairs(tc.lens)
			batches := planBatches(pairs, tc.maxTokens, tc.maxRow, 64, nil, nil)
			var seen []int
			for _, b := range batches {
				rows, maxLen, _ := shape(pairs, b)
				if rows == 0 {
					t.Fatalf("empty batch")
				}
				if rows > tc.maxRow {
					t.Errorf("batch %v has %d rows > %d", b, rows, tc.maxRow)
				}
				if rows > 1 && rows*max(maxLen, 1) > tc.maxTokens {
					t.Errorf("batch %v pads to %d tokens > %d", b, rows*maxLen, tc.maxTokens)
				}
				if rows == 1 && maxLen > tc.maxTokens {
					t.Logf("oversize pair %d (%d tokens) alone, as it must be", b[0], maxLen)
				}
				for k := 1; k < len(b); k++ {
					if pairs[b[k-1]].Len() > pairs[b[k]].Len() {
						t.Errorf("batch %v not sorted by length", b)
					}
				}
				seen = append(seen, b...)
			}
			slices.Sort(seen)
			for i, v := range seen {
				if v != i {
					t.Fatalf("pairs covered %v, want each of 0..%d once", seen, len(tc.lens)-1)
				}
			}
			if len(seen) != len(tc.lens) {
				t.Fatalf("covered %d pairs, want %d", len(seen), len(tc.lens))
			}
		})
	}
}

// realisticLengths draws pair lengths shaped like earnings-call sentences
// plus a short hypothesis and special tokens: log-normal sentence lengths
// (median ≈ 22 tokens, long tail), hypothesis 8–12 tokens, cap 512.
func realisticLengths(n int, seed uint64) []int {
	r := rand.New(rand.NewPCG(seed, 1))
	lens := make([]int, n)
	for i := range lens {
		sent := int(math.Exp(3.1 + 0.7*r.NormFloat64()))
		lens[i] = min(512, 3+max(1, sent)+8+r.IntN(5))
	}
	return lens
}

func TestPlanBatchesPaddingEfficiency(t *testing.T) {
	// A few hundred pairs cannot fill many batches of one length, so the
	// bar is lower there; large calls must waste under 10%.
	for _, tc := range []struct {
		n      int
		minEff float64
	}{{300, 0.8}, {3000, 0.9}, {12000, 0.95}} {
		n := tc.n
		pairs := makePairs(realisticLengths(n, uint64(n)))
		eff := func(batches [][]int) float64 {
			var real, padded int
			for _, b := range batches {
				rows, maxLen, r := shape(pairs, b)
				real += r
				padded += rows * maxLen
			}
			return float64(real) / float64(padded)
		}
		planned := planBatches(pairs, 16384, 256, 16384/32, nil, nil)
		// The naive plan: input order, fixed rows of 64.
		var naive [][]int
		for i := 0; i < n; i += 64 {
			var b []int
			for j := i; j < min(n, i+64); j++ {
				b = append(b, j)
			}
			naive = append(naive, b)
		}
		got, base := eff(planned), eff(naive)
		t.Logf("n=%d: planned efficiency %.3f in %d batches, naive %.3f in %d", n, got, len(planned), base, len(naive))
		if got < tc.minEff {
			t.Errorf("n=%d: planned padding efficiency %.3f < %.2f", n, got, tc.minEff)
		}
		if got <= base {
			t.Errorf("n=%d: planned efficiency %.3f not better than naive %.3f", n, got, base)
		}
	}
}

// The memory model's row cap binds where the token budget would allow
// more: long pairs go in batches no larger than the cap, short ones are
// unaffected.
func TestPlanBatchesRowCap(t *testing.T) {
	lens := append(slices.Repeat([]int{40}, 300), slices.Repeat([]int{400}, 100)...)
	pairs := makePairs(lens)
	rowCap := func(l int) int {
		if l > 100 {
			return 7
		}
		return 1 << 20
	}
	sawShortFull := false
	for _, b := range planBatches(pairs, 16384, 256, 512, rowCap, nil) {
		rows, maxLen, _ := shape(pairs, b)
		if maxLen > 100 && rows > 7 {
			t.Errorf("batch of %d rows at length %d, cap 7", rows, maxLen)
		}
		sawShortFull = sawShortFull || (maxLen <= 100 && rows > 7)
	}
	if !sawShortFull {
		t.Error("short pairs were capped too")
	}
}

// Batches come longest first, so a call's last batches, which leave workers
// idle when nothing else is queued, are its cheapest.
func TestPlanBatchesLongestFirst(t *testing.T) {
	lens := []int{40, 300, 12, 90, 500, 7, 64, 200}
	lens = slices.Repeat(lens, 20)
	pairs := makePairs(lens)
	batches := planBatches(pairs, 16384, 16, 512, nil, nil)
	prev := 1 << 30
	for i, b := range batches {
		_, maxLen, _ := shape(pairs, b)
		if maxLen > prev {
			t.Errorf("batch %d is padded to %d tokens, after a batch of %d: want longest first", i, maxLen, prev)
		}
		prev = maxLen
	}
}
