package model

import (
	"fmt"
	"math"
)

// ScoreMode says how a row of logits becomes P(entailment).
type ScoreMode string

const (
	// ScoreSoftmax takes the softmax over every class and reads the
	// entailment probability: the model's own calibrated view.
	ScoreSoftmax ScoreMode = "softmax"
	// ScoreEntailVsContradiction takes the softmax over only the
	// contradiction (or not_entailment) and entailment logits, which is what
	// Hugging Face's zero-shot pipeline does with multi_label=True; neutral
	// mass is ignored, so scores run higher than under ScoreSoftmax.
	ScoreEntailVsContradiction ScoreMode = "entail_vs_contradiction"
)

// ParseScoreMode turns configuration text into a ScoreMode; "" means
// ScoreSoftmax so an unset variable gets the default.
func ParseScoreMode(s string) (ScoreMode, error) {
	switch ScoreMode(s) {
	case "", ScoreSoftmax:
		return ScoreSoftmax, nil
	case ScoreEntailVsContradiction:
		return ScoreEntailVsContradiction, nil
	}
	return "", fmt.Errorf("model: unknown score mode %q (want %q or %q)", s, ScoreSoftmax, ScoreEntailVsContradiction)
}

// softmax returns the softmax of logits in float64. The maximum is
// subtracted first so large logits cannot overflow exp.
func softmax(logits []float32) []float64 {
	out := make([]float64, len(logits))
	if len(logits) == 0 {
		return out
	}
	maxv := math.Inf(-1)
	for _, v := range logits {
		maxv = math.Max(maxv, float64(v))
	}
	var sum float64
	for i, v := range logits {
		out[i] = math.Exp(float64(v) - maxv)
		sum += out[i]
	}
	for i := range out {
		out[i] /= sum
	}
	return out
}

// entailmentProb turns one row of logits into P(entailment) under mode. The
// indices have been validated against the row width at Load.
func entailmentProb(logits []float32, mode ScoreMode, entail, contra int) float32 {
	if mode == ScoreEntailVsContradiction {
		// softmax([c, e])[1] = 1/(1+exp(c-e)); the two-element softmax is
		// reused so the same overflow guard applies.
		p := softmax([]float32{logits[contra], logits[entail]})
		return float32(p[1])
	}
	return float32(softmax(logits)[entail])
}
