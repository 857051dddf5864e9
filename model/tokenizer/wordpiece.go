package tokenizer

import (
	"encoding/json"
	"fmt"
	"unicode/utf8"
)

// wordPiece is BERT's greedy longest-match-first subword model.
type wordPiece struct {
	vocab    map[string]int32
	size     int
	unkID    int32
	prefix   string
	maxChars int
}

func newWordPiece(raw json.RawMessage) (*wordPiece, error) {
	var c struct {
		Vocab    map[string]int32 `json:"vocab"`
		Unk      *string          `json:"unk_token"`
		Prefix   *string          `json:"continuing_subword_prefix"`
		MaxChars *int             `json:"max_input_chars_per_word"`
	}
	if err := json.Unmarshal(raw, &c); err != nil {
		return nil, fmt.Errorf("tokenizer: bad WordPiece model: %w", err)
	}
	if len(c.Vocab) == 0 {
		return nil, fmt.Errorf("tokenizer: WordPiece model has an empty vocab")
	}
	w := &wordPiece{vocab: c.Vocab, prefix: "##", maxChars: 100}
	for _, id := range c.Vocab {
		w.size = max(w.size, int(id)+1)
	}
	unk := "[UNK]"
	if c.Unk != nil {
		unk = *c.Unk
	}
	id, ok := c.Vocab[unk]
	if !ok {
		return nil, fmt.Errorf("tokenizer: WordPiece unk_token %q is not in the vocab", unk)
	}
	w.unkID = id
	if c.Prefix != nil {
		w.prefix = *c.Prefix
	}
	if c.MaxChars != nil {
		w.maxChars = *c.MaxChars
	}
	return w, nil
}

func (w *wordPiece) vocabSize() int { return w.size }

func (w *wordPiece) lookup(token string) (int32, bool) {
	id, ok := w.vocab[token]
	return id, ok
}

func (w *wordPiece) tokenize(word string, sc *scratch, out []int32) ([]int32, error) {
	if word == "" {
		return out, nil
	}
	if utf8.RuneCountInString(word) > w.maxChars {
		return append(out, w.unkID), nil
	}
	first := len(out)
	buf := append(sc.buf[:0], w.prefix...)
	for start := 0; start < len(word); {
		end := len(word)
		found := int32(-1)
		for start < end {
			var id int32
			var ok bool
			if start == 0 {
				id, ok = w.vocab[word[:end]]
			} else {
				buf = append(buf[:len(w.prefix)], word[start:end]...)
				id, ok = w.vocab[string(buf)] // no allocation: map index by converted bytes
			}
			if ok {
				found = id
				break
			}
			_, size := utf8.DecodeLastRuneInString(word[start:end])
			end -= size
		}
		if found < 0 {
			// One unmatchable piece makes the whole word unknown.
			sc.buf = buf
			return append(out[:first], w.unkID), nil
		}
		out = append(out, found)
		start = end
	}
	sc.buf = buf
	return out, nil
}
