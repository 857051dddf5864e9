package model

import (
	"fmt"

	"github.com/scorer/scorer/model/tokenizer"
)

// Pair is one encoded (premise, hypothesis) input; see tokenizer.Pair. The
// alias lets gpupool and the fan-out speak of model.Pair without importing
// the tokenizer.
type Pair = tokenizer.Pair

// PairEncoding says how a (premise, hypothesis) pair becomes one model
// input. It is part of the model's identity: the same sentence scores
// differently under each (0.990 as a pair and 0.923 joined, for one
// sentence on nli-deberta-v3-tiny), so records, cache keys and comparisons
// carry it.
type PairEncoding string

const (
	// EncodePair is the tokenizer's pair template, [CLS] premise [SEP]
	// hypothesis [SEP] with segment ids: what NLI models are trained on.
	// The default.
	EncodePair PairEncoding = "pair"
	// EncodeJoined is premise + separator + hypothesis as ONE sequence
	// through the single-sequence template, exactly as Hugging Face's
	// tokenizer encodes that string: what the Spark job this service
	// replaces fed its text-classification pipeline. Over the maximum
	// length only the premise is cut (tokenizer.EncodeJoined).
	EncodeJoined PairEncoding = "joined"
)

// DefaultPairSeparator is the Spark job's separator,
// f"{premise}</s></s>{hypothesis}". DeBERTa-v3's tokenizer has no </s>
// token, so it is ordinary text there.
const DefaultPairSeparator = "</s></s>"

// ParsePairEncoding turns configuration text into a PairEncoding; ""
// means EncodePair so an unset variable gets the default.
func ParsePairEncoding(s string) (PairEncoding, error) {
	switch PairEncoding(s) {
	case "", EncodePair:
		return EncodePair, nil
	case EncodeJoined:
		return EncodeJoined, nil
	}
	return "", fmt.Errorf("model: unknown pair encoding %q (want %q or %q)", s, EncodePair, EncodeJoined)
}

// EncodeText encodes one (premise, hypothesis) pair the way the model is
// configured to (PairEncoding), truncated to MaxLength. The transcript
// fan-out (internal/fanout) gives the same ids for every pair; it only
// reuses work where that is exact (each sentence's and hypothesis's own
// ids, in pair encoding).
func (m *Model) EncodeText(premise, hypothesis string) (Pair, error) {
	if m.PairEncoding == EncodeJoined {
		return m.Tokenizer.EncodeJoined(premise, m.PairSeparator, hypothesis, m.MaxLength)
	}
	p, err := m.Tokenizer.Encode(premise)
	if err != nil {
		return Pair{}, err
	}
	h, err := m.Tokenizer.Encode(hypothesis)
	if err != nil {
		return Pair{}, err
	}
	return m.Tokenizer.EncodePair(p, h, m.MaxLength), nil
}
