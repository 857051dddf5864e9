package model

import (
	"math"
	"path/filepath"
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

// logitsInBatches scores pairs 16 at a time, as the golden test does: the
// golden set's longest pairs in one batch would take gigabytes.
func logitsInBatches(t *testing.T, s *Session, pairs []Pair) [][]float32 {
	t.Helper()
	var out [][]float32
	for i := 0; i < len(pairs); i += 16 {
		got, err := s.Logits(t.Context(), pairs[i:min(i+16, len(pairs))])
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, got...)
	}
	return out
}

func testFloat16Model(t *testing.T, src string) {
	g := readGolden(t, filepath.Base(src))
	// Every fourth golden pair keeps all lengths up to the longest at a
	// quarter of the time (three graphs run on two cores).
	var pairs []Pair
	for i := 0; i < len(g.Cases); i += 4 {
		pairs = append(pairs, Pair{IDs: g.Cases[i].InputIDs, TypeIDs: g.Cases[i].TokenTypeIDs})
	}
	ref := sharedModel(t, src)
	want := logitsInBatches(t, newSession(t, ref), pairs)
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
				if sum := testenv.SHA256File(t, filepath.Join(dir, testenv.FP16File)); m.SHA256 != sum || m.Info().SHA256 != sum || sum == ref.SHA256 {
					t.Errorf("model sha256 %s (info %s), want the fp16 file's %s, not the fp32 %s", m.SHA256, m.Info().SHA256, sum, ref.SHA256)
				}
				if m.Info().Name != ref.Info().Name {
					t.Errorf("name %q, want the folder's %q", m.Info().Name, ref.Info().Name)
				}
				s := newSession(t, m)
				got := logitsInBatches(t, s, pairs)
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
				one, err := s.Logits(t.Context(), pairs[len(pairs)-1:])
				if err != nil {
					t.Fatal(err)
				}
				if d := math.Abs(float64(one[0][0] - got[len(got)-1][0])); d > 4*fp16Tolerance {
					t.Errorf("last pair alone vs in the batch: |Δlogit| %.3g", d)
				}
				if err := s.ReleaseArena(t.Context()); err != ErrNoArenaShrink {
					t.Errorf("ReleaseArena on a CPU session: %v, want ErrNoArenaShrink", err)
				}
			})
		}
	}
}
