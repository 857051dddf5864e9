package gpupool

import (
	"context"
	"testing"

	"github.com/scorer/scorer/model"
)

// padArenaEngine is an arenaEngine that pads each batch's length up to a
// multiple of k (not past 512), as model.Session does with
// PadToMultipleOf, and whose attention takes ONNX Runtime's unfused CUDA
// path at lengths that are not multiples of 8: 2·rows·heads·len² fp16
// elements of scratch on top of the fused path's footprint.
type padArenaEngine struct {
	*arenaEngine
	k int
}

func (e padArenaEngine) PadLength(n int) int {
	if e.k <= 1 {
		return n
	}
	return max(n, min((n+e.k-1)/e.k*e.k, e.MaxLength()))
}

// unfusedFootprint is mem's footprint at a batch of rows × length as run.
func unfusedFootprint(mem transformerMem, rows, length int) uint64 {
	need := mem.footprint(rows, length)
	if length%8 != 0 {
		need += uint64(2 * rows * mem.heads * length * length * 2)
	}
	return need
}

func newPadArenaEngine(dev *fakeDevice, mem transformerMem, k int) (Engine, error) {
	a, err := newArenaEngine(dev, mem, 0)
	if err != nil {
		return nil, err
	}
	e := padArenaEngine{arenaEngine: a, k: k}
	a.need = func(rows, length int) uint64 { return unfusedFootprint(mem, rows, e.PadLength(length)) }
	return e, nil
}

// TestCalibrationCoversUnfusedAttention: whether batches reach the GPU at
// any length (PAD_TO_MULTIPLE_OF=1) or padded to multiples of 8 (auto on
// CUDA), the calibrated memory model never under-predicts a batch the
// planner can make: every length from 1 to 512, at one row and at the
// rows the token budget allows. At odd lengths the fake's attention takes
// the unfused path with its len² scratch, which a ladder of multiples of 16
// never ran: fitted on those alone, the model came out under at odd
// lengths.
func TestCalibrationCoversUnfusedAttention(t *testing.T) {
	const maxTokens = 16384
	for _, k := range []int{1, 8} {
		mem := debertaFP16
		dev := &fakeDevice{total: 80 << 30}
		var eng Engine
		factory := func(Device) (Engine, error) {
			e, err := newPadArenaEngine(dev, mem, k)
			eng = e
			return e, err
		}
		p, err := New(testCtx(t), factory, Mode(ModeCUDA), WithProbe(deviceProbe{dev}), MaxBatchTokens(maxTokens), CPUFallback(false))
		if err != nil {
			t.Fatal(err)
		}
		est := p.devices[0].est
		if !est.Calibrated {
			t.Fatalf("pad to %d: not calibrated", k)
		}
		worst := 0.0
		for l := 1; l <= 512; l++ {
			pl := padLen(eng, l)
			for _, rows := range []int{1, max(1, min(256, maxTokens/pl))} {
				truth := float64(unfusedFootprint(mem, rows, pl))
				got := est.Bytes(rows, pl)
				worst = max(worst, truth/got)
				if got < truth {
					t.Errorf("pad to %d: %d×%d (run at %d): estimate %.1f MiB, true %.1f MiB", k, rows, l, pl, got/(1<<20), truth/(1<<20))
				}
			}
		}
		t.Logf("pad to %d: held-out margin %.3f, largest true/estimate %.3f", k, est.HeldOut, worst)
		// Odd lengths run and are scored: admission reserved their padded
		// shape, and the engine never ran out.
		mustScore(t, p, makePairs([]int{33, 41, 7, 509, 130, 3}))
		if n := eng.(padArenaEngine).oomCount(); n != 0 {
			t.Errorf("pad to %d: %d OOMs", k, n)
		}
		p.Close(context.Background())
	}
}

// TestPlanCountsPaddedLengths: the token budget holds for the lengths the
// engine runs at. Eight pairs of 33 tokens fit a budget of 8×33 as they
// are; padded to 40 they need 320 tokens, so the plan must split them.
func TestPlanCountsPaddedLengths(t *testing.T) {
	lens := []int{33, 33, 33, 33, 33, 33, 33, 33}
	pairs := makePairs(lens)
	budget := 8 * 33
	if got := planBatches(pairs, budget, 256, 1, nil, nil); len(got) != 1 {
		t.Fatalf("unpadded: %d batches, want one", len(got))
	}
	pad8 := func(n int) int { return (n + 7) / 8 * 8 }
	got := planBatches(pairs, budget, 256, 1, nil, pad8)
	if len(got) < 2 {
		t.Fatalf("padded to 8: %d batch, want the budget to split them", len(got))
	}
	seen := 0
	for _, b := range got {
		rows, maxLen, _ := shape(pairs, b)
		if rows*pad8(maxLen) > budget {
			t.Errorf("batch of %d rows padded to %d: %d tokens, budget %d", rows, pad8(maxLen), rows*pad8(maxLen), budget)
		}
		seen += rows
	}
	if seen != len(pairs) {
		t.Errorf("%d pairs planned, want %d", seen, len(pairs))
	}
	// The pool pads with its engines' PadLength.
	var _ LengthPadder = (*model.Session)(nil)
}
