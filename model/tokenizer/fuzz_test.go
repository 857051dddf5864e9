package tokenizer

import (
	"errors"
	"slices"
	"testing"
	"unicode/utf8"

	"github.com/scorer/scorer/internal/testenv"
)

// FuzzEncode feeds arbitrary bytes to the real tokenizers (our Unigram and
// WordPiece, DeBERTa-v3's, the tiny models' byte-level BPE): valid UTF-8
// must encode without error to in-range ids, identically twice (the second
// time through BPE's merge cache); anything else must be ErrInvalidUTF8,
// never a panic.
func FuzzEncode(f *testing.F) {
	toks := []*Tokenizer{loadModel(f, "nli-unigram-small"), loadModel(f, "nli-wordpiece-small"), loadModel(f, testenv.ProductionArch), loadModel(f, "nli-roberta-bpe-tiny")}
	for _, s := range []string{"", "Revenue grew 12%.", "[MASK]x[CLS]", "\u2581\u2581", "a\x00b", "👨‍👩‍👧", "\xff", "it's  \n\t'll <mask> </s>"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		for _, tok := range toks {
			ids, err := tok.Encode(s)
			if !utf8.ValidString(s) {
				if !errors.Is(err, ErrInvalidUTF8) {
					t.Fatalf("Encode(%q) on invalid UTF-8: err = %v", s, err)
				}
				continue
			}
			if err != nil {
				t.Fatalf("Encode(%q): %v", s, err)
			}
			checkRange(t, tok, ids)
			again, _ := tok.Encode(s)
			if !slices.Equal(ids, again) {
				t.Fatalf("Encode(%q) not deterministic: %v then %v", s, ids, again)
			}
			p := tok.EncodePair(ids, ids, 64)
			if p.Len() > 64 || len(p.TypeIDs) != p.Len() {
				t.Fatalf("EncodePair over budget: %d ids, %d type ids", p.Len(), len(p.TypeIDs))
			}
			j, err := tok.EncodeJoined(s, "</s></s>", s, 24)
			if err != nil || j.Len() > 24 || len(j.TypeIDs) != j.Len() {
				t.Fatalf("EncodeJoined(%q) over budget or failed: %d ids, %d type ids, %v", s, j.Len(), len(j.TypeIDs), err)
			}
			checkRange(t, tok, j.IDs)
		}
	})
}
