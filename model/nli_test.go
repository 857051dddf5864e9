package model

import (
	"math"
	"testing"
)

func TestParseScoreMode(t *testing.T) {
	tests := []struct {
		in      string
		want    ScoreMode
		wantErr bool
	}{
		{"", ScoreSoftmax, false},
		{"softmax", ScoreSoftmax, false},
		{"entail_vs_contradiction", ScoreEntailVsContradiction, false},
		{"Softmax", "", true},
		{"sigmoid", "", true},
	}
	for _, tc := range tests {
		got, err := ParseScoreMode(tc.in)
		if (err != nil) != tc.wantErr || got != tc.want {
			t.Errorf("ParseScoreMode(%q) = %q, %v; want %q, err %v", tc.in, got, err, tc.want, tc.wantErr)
		}
	}
}

func TestSoftmax(t *testing.T) {
	tests := []struct {
		name   string
		logits []float32
		want   []float64
	}{
		{"empty", nil, []float64{}},
		{"single", []float32{3}, []float64{1}},
		{"equal", []float32{1, 1}, []float64{0.5, 0.5}},
		{"two", []float32{0, float32(math.Log(3))}, []float64{0.25, 0.75}},
		{"shift invariant", []float32{100, 100 + float32(math.Log(3))}, []float64{0.25, 0.75}},
		// Naive exp overflows to +Inf at 89 in float32 and 710 in float64;
		// subtracting the max keeps these finite.
		{"huge", []float32{1000, 0, -1000}, []float64{1, 0, 0}},
		{"max float", []float32{math.MaxFloat32, math.MaxFloat32}, []float64{0.5, 0.5}},
		{"very negative", []float32{-1e30, -1e30 + 1e24}, []float64{0, 1}},
		{"three", []float32{1, 2, 3}, []float64{0.09003057317038046, 0.24472847105479764, 0.6652409557748219}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := softmax(tc.logits)
			if len(got) != len(tc.want) {
				t.Fatalf("softmax(%v) has %d values, want %d", tc.logits, len(got), len(tc.want))
			}
			sum := 0.0
			for i := range got {
				if math.IsNaN(got[i]) || math.Abs(got[i]-tc.want[i]) > 1e-6 {
					t.Errorf("softmax(%v)[%d] = %v, want %v", tc.logits, i, got[i], tc.want[i])
				}
				sum += got[i]
			}
			if len(got) > 0 && math.Abs(sum-1) > 1e-12 {
				t.Errorf("softmax(%v) sums to %v", tc.logits, sum)
			}
		})
	}
}

func TestEntailmentProb(t *testing.T) {
	ln3 := float32(math.Log(3))
	tests := []struct {
		name           string
		logits         []float32
		mode           ScoreMode
		entail, contra int
		want           float64
	}{
		{"softmax two-class", []float32{ln3, 0}, ScoreSoftmax, 0, 1, 0.75},
		{"softmax three-class, entail middle", []float32{0, ln3, 0}, ScoreSoftmax, 1, 0, 0.6},
		// The neutral logit (index 2) is ignored: 1/(1+exp(0-ln3)) = 0.75.
		{"entail vs contradiction ignores neutral", []float32{0, ln3, 50}, ScoreEntailVsContradiction, 1, 0, 0.75},
		{"entail vs contradiction, large gap", []float32{-500, 500, 0}, ScoreEntailVsContradiction, 1, 0, 1},
		{"entail vs not_entailment equals softmax", []float32{ln3, 0}, ScoreEntailVsContradiction, 0, 1, 0.75},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := entailmentProb(tc.logits, tc.mode, tc.entail, tc.contra)
			if math.Abs(float64(got)-tc.want) > 1e-6 {
				t.Errorf("entailmentProb(%v, %s, %d, %d) = %v, want %v", tc.logits, tc.mode, tc.entail, tc.contra, got, tc.want)
			}
		})
	}
}
