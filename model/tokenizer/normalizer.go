package tokenizer

import (
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"unicode"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

// normalizer rewrites one text segment. Offsets are not tracked: scoring
// only needs ids, which keeps each step a plain string function.
type normalizer interface {
	normalize(s string) string
}

type normalizerSeq []normalizer

func (s normalizerSeq) normalize(text string) string {
	for _, n := range s {
		text = n.normalize(text)
	}
	return text
}

type stripNormalizer struct{ left, right bool }

func (n stripNormalizer) normalize(s string) string {
	if n.left {
		s = strings.TrimLeftFunc(s, isRustWhitespace)
	}
	if n.right {
		s = strings.TrimRightFunc(s, isRustWhitespace)
	}
	return s
}

// isRustWhitespace is Rust's char::is_whitespace (the Unicode White_Space
// property), which HF uses wherever it says "whitespace".
func isRustWhitespace(r rune) bool {
	if r < utf8.RuneSelf {
		return r == ' ' || (r >= '\t' && r <= '\r')
	}
	return unicode.Is(unicode.White_Space, r)
}

type replaceNormalizer struct {
	literal string
	re      *regexp.Regexp
	content string
}

func (n replaceNormalizer) normalize(s string) string {
	if n.re != nil {
		return n.re.ReplaceAllLiteralString(s, n.content)
	}
	if n.literal == "" {
		return s
	}
	return strings.ReplaceAll(s, n.literal, n.content)
}

// unicodeNormalizer applies one of the four Unicode normal forms.
type unicodeNormalizer struct{ form norm.Form }

func (n unicodeNormalizer) normalize(s string) string { return n.form.String(s) }

type lowercaseNormalizer struct{}

func (lowercaseNormalizer) normalize(s string) string { return rustLower(s) }

// rustLower lowercases char by char like Rust's char::to_lowercase: full
// mappings but no context (no final sigma), as HF's NormalizedString does.
func rustLower(s string) string {
	ascii := true
	for i := 0; i < len(s); i++ {
		if c := s[i]; c >= utf8.RuneSelf || ('A' <= c && c <= 'Z') {
			ascii = false
			break
		}
	}
	if ascii {
		return s
	}
	var b strings.Builder
	b.Grow(len(s))
	for _, r := range s {
		if r == 'İ' {
			// The only unconditional one-to-many lowercase mapping.
			b.WriteString("i\u0307")
			continue
		}
		b.WriteRune(unicode.ToLower(r))
	}
	return b.String()
}

// bertNormalizer is HF's BertNormalizer: clean text, space out CJK
// ideographs, strip accents, lowercase, in that order.
type bertNormalizer struct {
	cleanText, chineseChars, stripAccents, lowercase bool
}

func isChineseChar(r rune) bool {
	return (r >= 0x4E00 && r <= 0x9FFF) || (r >= 0x3400 && r <= 0x4DBF) ||
		(r >= 0x20000 && r <= 0x2A6DF) || (r >= 0x2A700 && r <= 0x2B73F) ||
		(r >= 0x2B740 && r <= 0x2B81F) || (r >= 0x2B920 && r <= 0x2CEAF) ||
		(r >= 0xF900 && r <= 0xFAFF) || (r >= 0x2F800 && r <= 0x2FA1F)
}

func (n bertNormalizer) normalize(s string) string {
	if n.cleanText || n.chineseChars {
		var b strings.Builder
		b.Grow(len(s) + 8)
		for _, r := range s {
			if n.cleanText {
				if r != '\t' && r != '\n' && r != '\r' && unicode.Is(bertRemoved, r) {
					continue
				}
				if isRustWhitespace(r) {
					r = ' '
				}
			}
			if n.chineseChars && isChineseChar(r) {
				b.WriteByte(' ')
				b.WriteRune(r)
				b.WriteByte(' ')
				continue
			}
			b.WriteRune(r)
		}
		s = b.String()
	}
	if n.stripAccents {
		s = stripMn(norm.NFD.String(s))
	}
	if n.lowercase {
		s = rustLower(s)
	}
	return s
}

// stripMn drops nonspacing marks, which after NFD are the accents.
func stripMn(s string) string {
	var b strings.Builder
	b.Grow(len(s))
	for _, r := range s {
		if r >= 0x300 && unicode.Is(unicode.Mn, r) {
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

type precompiledNormalizer struct{ p *precompiled }

func (n precompiledNormalizer) normalize(s string) string { return n.p.normalize(s) }

// parsePattern reads HF's {"String": "..."} or {"Regex": "..."} pattern.
func parsePattern(raw json.RawMessage) (literal string, re *regexp.Regexp, err error) {
	var p struct {
		String *string `json:"String"`
		Regex  *string `json:"Regex"`
	}
	if err := json.Unmarshal(raw, &p); err != nil {
		return "", nil, fmt.Errorf("tokenizer: bad pattern %s: %w", raw, err)
	}
	switch {
	case p.String != nil:
		return *p.String, nil, nil
	case p.Regex != nil:
		re, err := regexp.Compile(*p.Regex)
		if err != nil {
			return "", nil, fmt.Errorf("tokenizer: regex %q not supported by Go's regexp: %w", *p.Regex, err)
		}
		return "", re, nil
	}
	return "", nil, fmt.Errorf("tokenizer: pattern %s has neither String nor Regex", raw)
}

func parseNormalizer(raw json.RawMessage) (normalizer, error) {
	var t typed
	if err := json.Unmarshal(raw, &t); err != nil {
		return nil, fmt.Errorf("tokenizer: bad normalizer: %w", err)
	}
	switch t.Type {
	case "Sequence":
		var c struct {
			Normalizers []json.RawMessage `json:"normalizers"`
		}
		if err := json.Unmarshal(raw, &c); err != nil {
			return nil, fmt.Errorf("tokenizer: bad Sequence normalizer: %w", err)
		}
		seq := make(normalizerSeq, 0, len(c.Normalizers))
		for i, sub := range c.Normalizers {
			n, err := parseNormalizer(sub)
			if err != nil {
				return nil, fmt.Errorf("tokenizer: normalizer %d of Sequence: %w", i, err)
			}
			seq = append(seq, n)
		}
		return seq, nil
	case "Strip":
		var c struct {
			Left  bool `json:"strip_left"`
			Right bool `json:"strip_right"`
		}
		if err := json.Unmarshal(raw, &c); err != nil {
			return nil, fmt.Errorf("tokenizer: bad Strip normalizer: %w", err)
		}
		return stripNormalizer{left: c.Left, right: c.Right}, nil
	case "Precompiled":
		var c struct {
			Charsmap *string `json:"precompiled_charsmap"`
		}
		if err := json.Unmarshal(raw, &c); err != nil {
			return nil, fmt.Errorf("tokenizer: bad Precompiled normalizer: %w", err)
		}
		if c.Charsmap == nil || *c.Charsmap == "" {
			// HF treats an empty charsmap as "no normalization".
			return normalizerSeq{}, nil
		}
		p, err := newPrecompiled(*c.Charsmap)
		if err != nil {
			return nil, err
		}
		return precompiledNormalizer{p}, nil
	case "Replace":
		var c struct {
			Pattern json.RawMessage `json:"pattern"`
			Content string          `json:"content"`
		}
		if err := json.Unmarshal(raw, &c); err != nil {
			return nil, fmt.Errorf("tokenizer: bad Replace normalizer: %w", err)
		}
		lit, re, err := parsePattern(c.Pattern)
		if err != nil {
			return nil, err
		}
		return replaceNormalizer{literal: lit, re: re, content: c.Content}, nil
	case "NFC":
		return unicodeNormalizer{norm.NFC}, nil
	case "NFD":
		return unicodeNormalizer{norm.NFD}, nil
	case "NFKC":
		return unicodeNormalizer{norm.NFKC}, nil
	case "NFKD":
		return unicodeNormalizer{norm.NFKD}, nil
	case "Lowercase":
		return lowercaseNormalizer{}, nil
	case "BertNormalizer":
		var c struct {
			CleanText    *bool `json:"clean_text"`
			ChineseChars *bool `json:"handle_chinese_chars"`
			StripAccents *bool `json:"strip_accents"`
			Lowercase    *bool `json:"lowercase"`
		}
		if err := json.Unmarshal(raw, &c); err != nil {
			return nil, fmt.Errorf("tokenizer: bad BertNormalizer: %w", err)
		}
		def := func(p *bool, d bool) bool {
			if p == nil {
				return d
			}
			return *p
		}
		n := bertNormalizer{
			cleanText:    def(c.CleanText, true),
			chineseChars: def(c.ChineseChars, true),
			lowercase:    def(c.Lowercase, true),
		}
		// strip_accents null means "do whatever lowercase does", as in BERT.
		n.stripAccents = def(c.StripAccents, n.lowercase)
		return n, nil
	case "StripAccents":
		return stripAccentsNormalizer{}, nil
	}
	return nil, fmt.Errorf("tokenizer: unsupported normalizer type %q", t.Type)
}

// stripAccentsNormalizer removes nonspacing marks without decomposing
// first, exactly like HF's StripAccents (pair it with NFD to drop accents).
type stripAccentsNormalizer struct{}

func (stripAccentsNormalizer) normalize(s string) string { return stripMn(s) }
