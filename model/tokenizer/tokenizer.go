// Package tokenizer turns text into model input ids exactly as the Hugging
// Face tokenizers library (0.22) does for a tokenizer.json, because a model
// only scores correctly on the ids it was trained and exported with. It
// covers the components NLI cross-encoders use (SentencePiece Unigram,
// BERT WordPiece and byte-level BPE pipelines: DeBERTa-v3, XLM-R, BERT,
// RoBERTa, BART, ModernBERT); anything else fails at Load, naming the type.
package tokenizer

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"unicode/utf8"
)

// Tokenizer is a tokenizer built from a tokenizer.json. It is immutable
// after Load, so one value is shared by every goroutine scoring sentences.
type Tokenizer struct {
	raw        addedMatcher // added tokens matched before normalization
	normalized addedMatcher // added tokens matched after normalization
	norm       normalizer   // nil = text used as is
	pre        preTokenizer
	model      model
	template   template // pair template
	single     template // single-sequence template (PAIR_ENCODING=joined)
	overhead   int      // special tokens the pair template adds
	singleOver int      // special tokens the single template adds
	padID      int32
	vocabSize  int
}

// ErrInvalidUTF8 is returned by Encode for text that is not valid UTF-8;
// the reference library only accepts Unicode strings, so there is no
// "right" answer to match.
var ErrInvalidUTF8 = errors.New("tokenizer: text is not valid UTF-8")

// Load reads the tokenizer.json at path and builds a Tokenizer from it.
// Unsupported component types are errors naming the type, never silently
// different ids.
func Load(path string) (*Tokenizer, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: read %s: %w", path, err)
	}
	t, err := parse(data)
	if err != nil {
		return nil, fmt.Errorf("%w (in %s)", err, path)
	}
	return t, nil
}

func parse(data []byte) (*Tokenizer, error) {
	var cfg fileConfig
	if err := json.Unmarshal(data, &cfg); err != nil {
		return nil, fmt.Errorf("tokenizer: malformed tokenizer.json: %w", err)
	}
	if isNull(cfg.Model) {
		return nil, errors.New("tokenizer: tokenizer.json has no model")
	}
	t := &Tokenizer{}
	mtype, err := modelType(cfg.Model)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: bad model: %w", err)
	}
	switch mtype {
	case "Unigram":
		u, err := newUnigram(cfg.Model)
		if err != nil {
			return nil, err
		}
		t.model = u
	case "WordPiece":
		w, err := newWordPiece(cfg.Model)
		if err != nil {
			return nil, err
		}
		t.model = w
	case "BPE":
		b, err := newBPE(cfg.Model)
		if err != nil {
			return nil, err
		}
		t.model = b
	default:
		return nil, fmt.Errorf("tokenizer: unsupported model type %q (supported: BPE, Unigram, WordPiece)", mtype)
	}
	t.vocabSize = t.model.vocabSize()
	if !isNull(cfg.Normalizer) {
		n, err := parseNormalizer(cfg.Normalizer)
		if err != nil {
			return nil, err
		}
		t.norm = n
	}
	t.pre = noPreTokenizer{}
	if !isNull(cfg.PreTokenizer) {
		p, err := parsePreTokenizer(cfg.PreTokenizer)
		if err != nil {
			return nil, err
		}
		t.pre = p
	}
	tmpl, err := parsePostProcessor(cfg.PostProcessor)
	if err != nil {
		return nil, err
	}
	t.template, t.single = tmpl.pair, tmpl.single
	t.overhead, t.singleOver = tmpl.pair.overhead(), tmpl.single.overhead()
	for _, a := range cfg.AddedTokens {
		if a.ID < 0 {
			return nil, fmt.Errorf("tokenizer: added token %q has negative id %d", a.Content, a.ID)
		}
		tok := addedToken{id: a.ID, content: a.Content, singleWord: a.SingleWord, lstrip: a.LStrip, rstrip: a.RStrip}
		// Special or not, the flag decides, as HF's AddedVocabulary
		// partitions its tries: DeBERTa-v3's [UNK] is a normalized special
		// token, so it is matched after the normalizer strips the text
		// around it ("and [UNK]" keeps a lone "▁" piece before it).
		if a.Normalized {
			tok.content = t.normalizeText(a.Content)
			t.normalized.tokens = append(t.normalized.tokens, tok)
		} else {
			t.raw.tokens = append(t.raw.tokens, tok)
		}
		t.vocabSize = max(t.vocabSize, int(a.ID)+1)
	}
	for _, p := range append(slices.Clip(t.template), t.single...) {
		for _, id := range p.special {
			if id < 0 || int(id) >= t.vocabSize {
				return nil, fmt.Errorf("tokenizer: post_processor special id %d outside vocab of %d", id, t.vocabSize)
			}
		}
	}
	t.padID = t.findPadID(cfg)
	return t, nil
}

// modelType is the model's "type". Hugging Face writes it as the model's
// first key, before a vocabulary of megabytes, so it is read as a stream
// and the rest is left to the model's own decoding; a "type" further on
// costs a scan past what comes before it.
func modelType(raw json.RawMessage) (string, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	if tok, err := dec.Token(); err != nil {
		return "", err
	} else if tok != json.Delim('{') {
		return "", fmt.Errorf("model is %v, want an object", tok)
	}
	for dec.More() {
		key, err := dec.Token()
		if err != nil {
			return "", err
		}
		if key == "type" {
			var typ string
			if err := dec.Decode(&typ); err != nil {
				return "", fmt.Errorf("type: %w", err)
			}
			return typ, nil
		}
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			return "", err
		}
	}
	return "", errors.New("model has no type")
}

func (t *Tokenizer) normalizeText(s string) string {
	if t.norm == nil {
		return s
	}
	return t.norm.normalize(s)
}

// findPadID prefers the explicit padding config, then the conventional pad
// token names; 0 is the last resort because every supported family uses it.
func (t *Tokenizer) findPadID(cfg fileConfig) int32 {
	if cfg.Padding != nil && cfg.Padding.PadID != nil {
		return *cfg.Padding.PadID
	}
	for _, name := range []string{"[PAD]", "<pad>"} {
		for _, a := range cfg.AddedTokens {
			if a.Content == name {
				return a.ID
			}
		}
		if id, ok := t.model.lookup(name); ok {
			return id
		}
	}
	return 0
}

// Encode returns the ids of text alone, without special tokens, as HF's
// encode(text, add_special_tokens=False) does. Pair scoring encodes
// sentences and hypotheses separately and joins them with EncodePair, so
// each hypothesis is encoded once per batch instead of once per sentence;
// joined scoring (EncodeJoined) cannot, see there.
func (t *Tokenizer) Encode(text string) ([]int32, error) {
	if !utf8.ValidString(text) {
		return nil, fmt.Errorf("%w (first bad byte at offset %d of %d)", ErrInvalidUTF8, firstInvalid(text), len(text))
	}
	var sc scratch
	var segs [8]segment
	var words [32]string
	out := make([]int32, 0, len(text)/3+1)
	for _, seg := range t.raw.split(text, 0, segs[:0]) {
		if seg.id >= 0 {
			out = append(out, seg.id)
			continue
		}
		normed := t.normalizeText(seg.text)
		var inner [4]segment
		for _, sub := range t.normalized.split(normed, seg.start, inner[:0]) {
			if sub.id >= 0 {
				out = append(out, sub.id)
				continue
			}
			ws := t.pre.split(sub.text, sub.start == 0, words[:0])
			for _, w := range ws {
				var err error
				if out, err = t.model.tokenize(w, &sc, out); err != nil {
					return nil, err
				}
			}
		}
	}
	return out, nil
}

// EncodePair joins already encoded premise and hypothesis ids with the
// post-processor's pair template. Only the premise is truncated (HF's
// "only_first") so the result fits maxLen: the hypothesis carries the
// label and must survive intact. If the hypothesis alone leaves no room,
// where HF would fail, it is cut too so the model never sees more than
// maxLen tokens. maxLen <= 0 means no limit.
func (t *Tokenizer) EncodePair(premise, hypothesis []int32, maxLen int) Pair {
	if maxLen > 0 {
		budget := max(maxLen-t.overhead, 0)
		if len(premise)+len(hypothesis) > budget {
			premise = premise[:max(budget-len(hypothesis), 0)]
			if len(hypothesis) > budget {
				hypothesis = hypothesis[:budget]
			}
		}
	}
	return t.template.apply(premise, hypothesis)
}

// PadID is the id batches are padded with.
func (t *Tokenizer) PadID() int32 { return t.padID }

// NumSpecialTokensPair is how many tokens the pair template adds, which
// callers subtract from the model's maximum length when budgeting.
func (t *Tokenizer) NumSpecialTokensPair() int { return t.overhead }

func firstInvalid(s string) int {
	for i, r := range s {
		if r == utf8.RuneError {
			if _, size := utf8.DecodeRuneInString(s[i:]); size == 1 {
				return i
			}
		}
	}
	return len(s)
}
