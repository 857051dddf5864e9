package model

import (
	"context"
	"fmt"
	"slices"
)

// eosHeadArchitectures are Hugging Face sequence classifiers whose head reads
// the hidden state of each row's last eos token the way
// BartForSequenceClassification does:
//
//	hidden[input_ids == eos].view(batch, -1, d)[:, -1, :]
//
// HF raises when the rows of a batch hold different numbers of eos tokens;
// the ONNX exports (torch.onnx, optimum) keep the gather and the reshape but
// not the check, so such a batch fails in the Reshape or, when the counts
// happen to divide evenly, silently reads one row's eos for another. A row
// without any eos fails in the Gather. eosRows keeps every batch this graph
// sees to one count.
var eosHeadArchitectures = []string{
	"BartForSequenceClassification",
	"MBartForSequenceClassification",
	"PLBartForSequenceClassification",
	"LEDForSequenceClassification",
	"BigBirdPegasusForSequenceClassification",
}

// eosHeadID is config.json's eos_token_id when its architectures name an
// eos-head classifier, else -1. Such a config without eos_token_id is
// refused: the head cannot be fed safely without knowing the token.
func eosHeadID(architectures []string, eos *int) (int32, error) {
	i := slices.IndexFunc(architectures, func(a string) bool { return slices.Contains(eosHeadArchitectures, a) })
	if i < 0 {
		return -1, nil
	}
	if eos == nil || *eos < 0 {
		return -1, fmt.Errorf("architecture %s reads the last eos token of each row, but config.json has no eos_token_id", architectures[i])
	}
	return int32(*eos), nil
}

// checkEOSHead refuses a tokenizer whose pair encoding puts no eos token in a
// row: the head would have nothing to read, and eosRows would replace a real
// token. Real BART tokenizers end every sequence with </s>.
func (m *Model) checkEOSHead() error {
	if m.eosHead < 0 {
		return nil
	}
	p, err := m.EncodeText("a", "b")
	if err != nil {
		return fmt.Errorf("model: encoding a test pair: %w", err)
	}
	if !slices.Contains(p.IDs, m.eosHead) {
		return fmt.Errorf("model: the classifier reads each row's last eos token (id %d), but the tokenizer's %s encoding of a pair has none: %v", m.eosHead, m.PairEncoding, p.IDs)
	}
	return nil
}

// eosRows prepares a batch for an eos-head graph: a row without the eos
// token gets its last token replaced by it (only synthetic rows, calibration
// and the arena release, lack one: checkEOSHead made sure every encoded pair
// has one, and their content does not matter), and when the rows hold
// different numbers of eos tokens (a premise with a literal "</s>", which the
// tokenizer reads as the token, as HF's does) groups lists the row indices
// of each count, in order of first appearance. pairs is returned unchanged,
// and groups nil, for other models and for batches that can run as one.
func (m *Model) eosRows(pairs []Pair) ([]Pair, [][]int) {
	if m.eosHead < 0 {
		return pairs, nil
	}
	var fixed []Pair
	byCount := map[int]int{} // eos count -> index in groups
	var groups [][]int
	for i, p := range pairs {
		n := 0
		for _, id := range p.IDs {
			if id == m.eosHead {
				n++
			}
		}
		if n == 0 && len(p.IDs) > 0 {
			if fixed == nil {
				fixed = slices.Clone(pairs)
			}
			ids := slices.Clone(p.IDs)
			ids[len(ids)-1] = m.eosHead
			fixed[i].IDs, n = ids, 1
		}
		g, ok := byCount[n]
		if !ok {
			g = len(groups)
			byCount[n] = g
			groups = append(groups, nil)
		}
		groups[g] = append(groups[g], i)
	}
	if fixed != nil {
		pairs = fixed
	}
	if len(groups) < 2 {
		return pairs, nil
	}
	return pairs, groups
}

// logitsGrouped runs each group of rows (eosRows) as its own batch and puts
// the rows back in input order.
func (s *Session) logitsGrouped(ctx context.Context, pairs []Pair, groups [][]int, entries map[string]string) ([][]float32, error) {
	out := make([][]float32, len(pairs))
	for _, g := range groups {
		sub := make([]Pair, len(g))
		for i, j := range g {
			sub[i] = pairs[j]
		}
		rows, err := s.logits(ctx, sub, entries)
		if err != nil {
			return nil, err
		}
		for i, j := range g {
			out[j] = rows[i]
		}
	}
	return out, nil
}
