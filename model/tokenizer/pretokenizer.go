package tokenizer

import (
	"encoding/json"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// preTokenizer splits normalized text into words the model encodes one by
// one. first says whether the text starts at byte 0 of the original input,
// which Metaspace's "first" prepend scheme depends on. Pieces are appended
// to out and may alias text.
type preTokenizer interface {
	split(text string, first bool, out []string) []string
}

type preTokenizerSeq []preTokenizer

func (s preTokenizerSeq) split(text string, first bool, out []string) []string {
	if len(s) == 0 {
		return append(out, text)
	}
	base := len(out)
	out = s[0].split(text, first, out)
	for _, p := range s[1:] {
		cur := append([]string(nil), out[base:]...)
		out = out[:base]
		for i, piece := range cur {
			out = p.split(piece, first && i == 0, out)
		}
	}
	return out
}

// noPreTokenizer keeps the whole segment as one word.
type noPreTokenizer struct{}

func (noPreTokenizer) split(text string, _ bool, out []string) []string {
	if text == "" {
		return out
	}
	return append(out, text)
}

const (
	prependAlways = iota
	prependFirst
	prependNever
)

// metaspace replaces spaces with the replacement (U+2581 "▁") so that
// SentencePiece pieces, which carry the word boundary, can be looked up.
type metaspace struct {
	replacement string
	prepend     int
	splitWords  bool
}

func (m metaspace) split(text string, first bool, out []string) []string {
	if text == "" {
		return out
	}
	s := strings.ReplaceAll(text, " ", m.replacement)
	if !strings.HasPrefix(s, m.replacement) &&
		(m.prepend == prependAlways || (m.prepend == prependFirst && first)) {
		s = m.replacement + s
	}
	if !m.splitWords {
		return append(out, s)
	}
	// MergedWithNext: every replacement starts a new word.
	start := 0
	for start < len(s) {
		j := strings.Index(s[start+1:], m.replacement)
		if j < 0 {
			break
		}
		end := start + 1 + j
		out = append(out, s[start:end])
		start = end
	}
	return append(out, s[start:])
}

// whitespaceSplit splits on Unicode whitespace, dropping it.
type whitespaceSplit struct{}

func (whitespaceSplit) split(text string, _ bool, out []string) []string {
	start := -1
	for i, r := range text {
		if isRustWhitespace(r) {
			if start >= 0 {
				out = append(out, text[start:i])
				start = -1
			}
		} else if start < 0 {
			start = i
		}
	}
	if start >= 0 {
		out = append(out, text[start:])
	}
	return out
}

// bertPreTokenizer splits on whitespace and isolates every punctuation
// character, as BERT's basic tokenizer does.
type bertPreTokenizer struct{}

func isBertPunct(r rune) bool {
	if r < utf8.RuneSelf {
		return (r >= '!' && r <= '/') || (r >= ':' && r <= '@') || (r >= '[' && r <= '`') || (r >= '{' && r <= '~')
	}
	return unicode.Is(bertPunct, r)
}

func (bertPreTokenizer) split(text string, _ bool, out []string) []string {
	start := -1
	for i, r := range text {
		switch {
		case isRustWhitespace(r):
			if start >= 0 {
				out = append(out, text[start:i])
				start = -1
			}
		case isBertPunct(r):
			if start >= 0 {
				out = append(out, text[start:i])
				start = -1
			}
			out = append(out, text[i:i+utf8.RuneLen(r)])
		default:
			if start < 0 {
				start = i
			}
		}
	}
	if start >= 0 {
		out = append(out, text[start:])
	}
	return out
}

// whitespacePre is HF's Whitespace pre-tokenizer, the regex \w+|[^\w\s]+:
// runs of word characters and runs of other non-space characters.
type whitespacePre struct{}

func (whitespacePre) split(text string, _ bool, out []string) []string {
	const (
		none = iota
		word
		other
	)
	kind, start := none, 0
	for i, r := range text {
		k := other
		switch {
		case isWordRune(r):
			k = word
		case isRustWhitespace(r):
			k = none
		}
		if k != kind {
			if kind != none {
				out = append(out, text[start:i])
			}
			kind, start = k, i
		}
	}
	if kind != none {
		out = append(out, text[start:])
	}
	return out
}

func parsePreTokenizer(raw json.RawMessage) (preTokenizer, error) {
	var t typed
	if err := json.Unmarshal(raw, &t); err != nil {
		return nil, fmt.Errorf("tokenizer: bad pre_tokenizer: %w", err)
	}
	switch t.Type {
	case "Sequence":
		var c struct {
			PreTokenizers []json.RawMessage `json:"pretokenizers"`
		}
		if err := json.Unmarshal(raw, &c); err != nil {
			return nil, fmt.Errorf("tokenizer: bad Sequence pre_tokenizer: %w", err)
		}
		seq := make(preTokenizerSeq, 0, len(c.PreTokenizers))
		for i, sub := range c.PreTokenizers {
			p, err := parsePreTokenizer(sub)
			if err != nil {
				return nil, fmt.Errorf("tokenizer: pre_tokenizer %d of Sequence: %w", i, err)
			}
			seq = append(seq, p)
		}
		return seq, nil
	case "Metaspace":
		var c struct {
			Replacement    *string `json:"replacement"`
			PrependScheme  *string `json:"prepend_scheme"`
			AddPrefixSpace *bool   `json:"add_prefix_space"`
			Split          *bool   `json:"split"`
		}
		if err := json.Unmarshal(raw, &c); err != nil {
			return nil, fmt.Errorf("tokenizer: bad Metaspace pre_tokenizer: %w", err)
		}
		m := metaspace{replacement: "\u2581", prepend: prependAlways, splitWords: true}
		if c.Replacement != nil {
			if utf8.RuneCountInString(*c.Replacement) != 1 {
				return nil, fmt.Errorf("tokenizer: Metaspace replacement %q must be one character", *c.Replacement)
			}
			m.replacement = *c.Replacement
		}
		if c.Split != nil {
			m.splitWords = *c.Split
		}
		switch {
		case c.PrependScheme != nil:
			switch *c.PrependScheme {
			case "always":
				m.prepend = prependAlways
			case "first":
				m.prepend = prependFirst
			case "never":
				m.prepend = prependNever
			default:
				return nil, fmt.Errorf("tokenizer: unsupported Metaspace prepend_scheme %q", *c.PrependScheme)
			}
		case c.AddPrefixSpace != nil && !*c.AddPrefixSpace:
			// Files from before prepend_scheme existed use add_prefix_space.
			m.prepend = prependNever
		}
		return m, nil
	case "ByteLevel":
		var c struct {
			AddPrefixSpace *bool `json:"add_prefix_space"`
			UseRegex       *bool `json:"use_regex"`
		}
		if err := json.Unmarshal(raw, &c); err != nil {
			return nil, fmt.Errorf("tokenizer: bad ByteLevel pre_tokenizer: %w", err)
		}
		p := byteLevel{addPrefixSpace: true, useRegex: true}
		if c.AddPrefixSpace != nil {
			p.addPrefixSpace = *c.AddPrefixSpace
		}
		if c.UseRegex != nil {
			p.useRegex = *c.UseRegex
		}
		return p, nil
	case "Split":
		var c struct {
			Pattern  json.RawMessage `json:"pattern"`
			Behavior string          `json:"behavior"`
			Invert   bool            `json:"invert"`
		}
		if err := json.Unmarshal(raw, &c); err != nil {
			return nil, fmt.Errorf("tokenizer: bad Split pre_tokenizer: %w", err)
		}
		behavior, ok := splitBehaviors[c.Behavior]
		if !ok {
			return nil, fmt.Errorf("tokenizer: unsupported Split behavior %q", c.Behavior)
		}
		var p struct {
			String *string `json:"String"`
			Regex  *string `json:"Regex"`
		}
		if err := json.Unmarshal(c.Pattern, &p); err != nil {
			return nil, fmt.Errorf("tokenizer: bad Split pattern %s: %w", c.Pattern, err)
		}
		switch {
		case p.String != nil:
			return splitPre{m: literalMatcher(*p.String), behavior: behavior, invert: c.Invert}, nil
		case p.Regex != nil:
			m, err := translateRegex(*p.Regex)
			if err != nil {
				return nil, fmt.Errorf("tokenizer: unsupported Split regex %q: %w", *p.Regex, err)
			}
			return splitPre{m: m, behavior: behavior, invert: c.Invert}, nil
		}
		return nil, fmt.Errorf("tokenizer: Split pattern %s has neither String nor Regex", c.Pattern)
	case "BertPreTokenizer":
		return bertPreTokenizer{}, nil
	case "WhitespaceSplit":
		return whitespaceSplit{}, nil
	case "Whitespace":
		return whitespacePre{}, nil
	}
	return nil, fmt.Errorf("tokenizer: unsupported pre_tokenizer type %q (supported: %s)", t.Type, supportedPreTokenizers)
}

const supportedPreTokenizers = "ByteLevel, Split, Sequence, Metaspace, BertPreTokenizer, Whitespace, WhitespaceSplit"
