package fanout

import (
	"errors"
	"fmt"
	"math"
	"strings"

	"github.com/scorer/scorer/model"
)

// LabelConfig is the zero-shot question asked of every sentence: one
// hypothesis per label, built from Template, and the score above which a
// sentence counts as a match.
type LabelConfig struct {
	// Template holds exactly one "{}", replaced by each label.
	Template string
	// Labels are the topics to test, in output order.
	Labels []string
	// Threshold flags a sentence when its score is strictly greater.
	Threshold float64
}

// DefaultLabelConfig is the production question set: consumer strength and
// weakness, as the original notebook asked it.
func DefaultLabelConfig() LabelConfig {
	return LabelConfig{
		Template:  "This text is about {}.",
		Labels:    []string{"consumer strength", "consumer weakness", "reduced consumer's spending patterns"},
		Threshold: 0.91,
	}
}

// Validate rejects a config that would produce meaningless or ambiguous
// output: no labels, duplicate labels (results are keyed by label), a
// template without exactly one slot, or a threshold outside [0, 1].
func (c LabelConfig) Validate() error {
	if n := strings.Count(c.Template, "{}"); n != 1 {
		return fmt.Errorf("fanout: hypothesis template %q must contain exactly one {}, has %d", c.Template, n)
	}
	if len(c.Labels) == 0 {
		return errors.New("fanout: no labels")
	}
	seen := make(map[string]bool, len(c.Labels))
	for i, l := range c.Labels {
		if strings.TrimSpace(l) == "" {
			return fmt.Errorf("fanout: label %d is empty", i)
		}
		if seen[l] {
			return fmt.Errorf("fanout: label %q appears twice", l)
		}
		seen[l] = true
	}
	if math.IsNaN(c.Threshold) || c.Threshold < 0 || c.Threshold > 1 {
		return fmt.Errorf("fanout: threshold %v is outside [0, 1]", c.Threshold)
	}
	return nil
}

// Hypotheses returns the hypothesis text for each label, in label order.
func (c LabelConfig) Hypotheses() []string {
	out := make([]string, len(c.Labels))
	for i, l := range c.Labels {
		out[i] = strings.Replace(c.Template, "{}", l, 1)
	}
	return out
}

// hypothesisRoom checks that hypothesis leaves a premise at least one
// token within m's MaxLength under its encoding. ids are the hypothesis's
// own ids (pair encoding); joined encoding measures the separator and
// hypothesis encoded together.
func hypothesisRoom(m *model.Model, hypothesis string, ids []int32) error {
	n, special := len(ids), m.Tokenizer.NumSpecialTokensPair()
	if m.PairEncoding == model.EncodeJoined {
		tail, err := m.Tokenizer.Encode(m.PairSeparator + hypothesis)
		if err != nil {
			return err
		}
		n, special = len(tail), m.Tokenizer.NumSpecialTokensSingle()
	}
	if n > m.MaxLength-special-1 {
		what := "hypothesis"
		if m.PairEncoding == model.EncodeJoined {
			what = "separator and hypothesis"
		}
		return fmt.Errorf("fanout: %s %q is %d tokens, leaving no room for a sentence within max length %d", what, hypothesis, n, m.MaxLength)
	}
	return nil
}
