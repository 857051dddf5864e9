package model

import (
	"math"
	"path/filepath"
	"slices"
	"testing"

	ort "github.com/yalue/onnxruntime_go"

	"github.com/scorer/scorer/internal/testenv"
)

// fp16Tolerance is how far a float16 graph's P(entailment) may fall from
// its float32 source's on the CPU: float16 keeps 11 significant bits
// (relative step 2⁻¹¹ ≈ 4.9e-4), and a few layers of rounded weights and
// activations add up to some 1e-3 on a logit. Bigger is a wrong conversion
// or a wrong read, not precision: a float16 tensor read as bytes, or a
// lost subnormal, moves scores by far more.
const fp16Tolerance = 0.01

// A float16 graph, in both shipped forms (float16 logits as Optimum
// exports them, and float32 I/O around a float16 body), loads through
// ONNXFile (MODEL_FILE), names itself by its own file's hash, and scores
// the golden pairs of every test model within float16's precision of the
// float32 graph, in batches with padding.
func TestFloat16Models(t *testing.T) {
	for _, src := range testenv.ModelDirs(t) {
		name := filepath.Base(src)
		if testing.Short() && name != testenv.ProductionArch {
			t.Logf("-short: %s skipped, only the production architecture converted; make test converts every shared model", name)
			continue
		}
		t.Run(name, func(t *testing.T) { testFloat16Model(t, src) })
	}
}

// logitsInBatches scores pairs 16 at a time in length order, as the golden
// test does (the golden set's longest pairs in one batch would take
// gigabytes, and in input order nearly every batch would be padded to
// nearly the longest), and returns the logits in input order and the order
// the batches took them in: batch k is order[16k:16k+16].
func logitsInBatches(t *testing.T, s *Session, pairs []Pair) ([][]float32, []int) {
	t.Helper()
	order := make([]int, len(pairs))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return len(pairs[a].IDs) - len(pairs[b].IDs) })
	out := make([][]float32, len(pairs))
	for start := 0; start < len(order); start += 16 {
		idx := order[start:min(start+16, len(order))]
		batch := make([]Pair, len(idx))
		for k, i := range idx {
			batch[k] = pairs[i]
		}
		got, err := s.Logits(t.Context(), batch)
		if err != nil {
			t.Fatal(err)
		}
		for k, i := range idx {
			out[i] = got[k]
		}
	}
	return out, order
}

// paddedRow is the pair that logitsInBatches scored in a row after the
// first of its batch and padded to a longer pair of that batch, the longest
// such: read alone and in its batch, it tells a per-row read from a
// per-buffer one.
func paddedRow(t *testing.T, pairs []Pair, order []int) int {
	t.Helper()
	for k := len(order) - 1; k > 0; k-- {
		end := min(k/16*16+16, len(order))
		if k%16 != 0 && len(pairs[order[k]].IDs) < len(pairs[order[end-1]].IDs) {
			return order[k]
		}
	}
	t.Fatal("no pair was padded in a row after the first of its batch")
	return -1
}

// The reference is the golden file's logits: the float32 graph's, computed
// pair by pair by the reference stack, to which TestGoldenScores holds this
// package's float32 session within 1e-4, a hundredth of the float16
// tolerance (running the float32 graph again here would check the same).
func testFloat16Model(t *testing.T, src string) {
	g := readGolden(t, filepath.Base(src))
	// Every fourth golden pair keeps all lengths up to the longest at a
	// quarter of the time (two graphs run on two cores); under -short every
	// sixteenth and the longest (make test scores every fourth).
	cases := g.Cases
	if testing.Short() {
		cases = shortGoldenCases(cases)
	} else {
		cases = nil
		for i := 0; i < len(g.Cases); i += 4 {
			cases = append(cases, g.Cases[i])
		}
	}
	var pairs []Pair
	var want [][]float32
	for _, c := range cases {
		pairs = append(pairs, Pair{IDs: c.InputIDs, TypeIDs: c.TokenTypeIDs})
		row := make([]float32, len(c.Logits))
		for k, v := range c.Logits {
			row[k] = float32(v)
		}
		want = append(want, row)
	}
	ref := sharedModel(t, src)
	{
		for _, form := range []struct {
			name   string
			keepIO bool
			out    ort.TensorElementDataType
		}{{"fp16-logits", false, ort.TensorElementDataTypeFloat16}, {"fp32-io", true, ort.TensorElementDataTypeFloat}} {
			t.Run(form.name, func(t *testing.T) {
				dir := testenv.FP16ModelDir(t, src, form.keepIO)
				m := loadModel(t, LoadOptions{Dir: dir, ONNXFile: testenv.FP16File})
				if m.OutputType != form.out {
					t.Fatalf("OutputType %v, want %v", m.OutputType, form.out)
				}
				if sum := testenv.ModelVersion(t, dir, testenv.FP16File); m.SHA256 != sum || m.Info().SHA256 != sum || sum == ref.SHA256 {
					t.Errorf("model sha256 %s (info %s), want the fp16 file's %s, not the fp32 %s", m.SHA256, m.Info().SHA256, sum, ref.SHA256)
				}
				if m.Info().Name != ref.Info().Name {
					t.Errorf("name %q, want the folder's %q", m.Info().Name, ref.Info().Name)
				}
				s := newSession(t, m)
				got, order := logitsInBatches(t, s, pairs)
				var maxLogit, maxP float64
				for i := range got {
					for k := range got[i] {
						if math.IsNaN(float64(got[i][k])) || math.IsInf(float64(got[i][k]), 0) {
							t.Fatalf("pair %d: logit %v", i, got[i][k])
						}
						maxLogit = math.Max(maxLogit, math.Abs(float64(got[i][k]-want[i][k])))
					}
					p := entailmentProb(got[i], m.ScoreMode, m.EntailmentIndex, m.ContradictionIndex)
					q := entailmentProb(want[i], ref.ScoreMode, ref.EntailmentIndex, ref.ContradictionIndex)
					maxP = math.Max(maxP, math.Abs(float64(p-q)))
				}
				t.Logf("%d pairs: max |Δlogit| %.2g, max |Δp| %.2g", len(pairs), maxLogit, maxP)
				if maxP > fp16Tolerance || maxLogit > 4*fp16Tolerance {
					t.Errorf("float16 vs float32: max |Δp| %.3g, max |Δlogit| %.3g; want ≤ %g and ≤ %g", maxP, maxLogit, fp16Tolerance, 4*fp16Tolerance)
				}
				// Batches of different padding give the same float16 result
				// as one pair alone: the read is per row, not per buffer.
				i := paddedRow(t, pairs, order)
				one, err := s.Logits(t.Context(), pairs[i:i+1])
				if err != nil {
					t.Fatal(err)
				}
				if d := math.Abs(float64(one[0][0] - got[i][0])); d > 4*fp16Tolerance {
					t.Errorf("pair %d (%d tokens) alone vs padded in its batch: |Δlogit| %.3g", i, len(pairs[i].IDs), d)
				}
				if err := s.ReleaseArena(t.Context()); err != ErrNoArenaShrink {
					t.Errorf("ReleaseArena on a CPU session: %v, want ErrNoArenaShrink", err)
				}
			})
		}
	}
}
