package tokenizer

import (
	"strings"
	"unicode"
	"unicode/utf8"
)

// byteChar is GPT-2's bytes_to_unicode: every byte as a printable
// character, so a byte-level vocabulary holds no control characters or
// spaces. Printable Latin-1 bytes stand for themselves; the rest take the
// code points from U+0100 up, in byte order (space is "Ġ", U+0120).
var byteChar = func() (m [256]string) {
	n := 0
	for b := range 256 {
		if ('!' <= b && b <= '~') || (0xA1 <= b && b <= 0xAC) || (0xAE <= b && b <= 0xFF) {
			m[b] = string(rune(b))
		} else {
			m[b] = string(rune(256 + n))
			n++
		}
	}
	return m
}()

// byteLevel is HF's ByteLevel pre-tokenizer: optionally a space before
// each segment, GPT-2's split into words, then every byte mapped through
// byteChar. trim_offsets only moves offsets, which scoring does not use.
type byteLevel struct {
	addPrefixSpace bool
	useRegex       bool
}

func (p byteLevel) split(text string, _ bool, out []string) []string {
	if text == "" {
		return out
	}
	// HF prepends to every segment the added tokens leave, not only the
	// first one.
	if p.addPrefixSpace && text[0] != ' ' {
		text = " " + text
	}
	if !p.useRegex {
		return append(out, byteMap(text))
	}
	for i := 0; i < len(text); {
		j := gpt2Next(text, i)
		out = append(out, byteMap(text[i:j]))
		i = j
	}
	return out
}

// byteMap maps each byte of s through byteChar. Text of printable ASCII
// only maps to itself and is returned as is.
func byteMap(s string) string {
	plain := true
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < '!' || c > '~' {
			plain = false
			break
		}
	}
	if plain {
		return s
	}
	var b strings.Builder
	b.Grow(2 * len(s))
	for i := 0; i < len(s); i++ {
		b.WriteString(byteChar[s[i]])
	}
	return b.String()
}

// Character classes of GPT-2's pattern, as Oniguruma (which HF compiles it
// with) reads them: \p{L}, \p{N} and \s (White_Space).
const (
	gpt2Space = iota
	gpt2Letter
	gpt2Number
	gpt2Other
)

func gpt2Class(r rune) int {
	switch {
	case r < utf8.RuneSelf:
		switch {
		case ('a' <= r && r <= 'z') || ('A' <= r && r <= 'Z'):
			return gpt2Letter
		case '0' <= r && r <= '9':
			return gpt2Number
		case r == ' ' || ('\t' <= r && r <= '\r'):
			return gpt2Space
		}
		return gpt2Other
	case unicode.IsLetter(r):
		return gpt2Letter
	case unicode.IsNumber(r):
		return gpt2Number
	case unicode.Is(unicode.White_Space, r):
		return gpt2Space
	}
	return gpt2Other
}

// gpt2Next is the end of the match of GPT-2's pre-tokenizer pattern
//
//	's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//
// that starts at i. Every character matches one alternative, so matches
// tile the text. Go's regexp has no lookahead, hence a hand-written
// matcher with the regex engine's leftmost-first choice among alternatives.
func gpt2Next(s string, i int) int {
	if s[i] == '\'' && i+1 < len(s) {
		switch s[i+1] {
		case 's', 't', 'm', 'd':
			return i + 2
		case 'r', 'v':
			if i+2 < len(s) && s[i+2] == 'e' {
				return i + 3
			}
		case 'l':
			if i+2 < len(s) && s[i+2] == 'l' {
				return i + 3
			}
		}
	}
	start := i
	if s[i] == ' ' && i+1 < len(s) {
		// " ?" takes the space when a letter, number or other character
		// follows; before more whitespace the space is left to \s+.
		if r, _ := utf8.DecodeRuneInString(s[i+1:]); gpt2Class(r) != gpt2Space {
			start = i + 1
		}
	}
	r, size := utf8.DecodeRuneInString(s[start:])
	class := gpt2Class(r)
	if class != gpt2Space {
		j := start + size
		for j < len(s) {
			r, size := utf8.DecodeRuneInString(s[j:])
			if gpt2Class(r) != class {
				break
			}
			j += size
		}
		return j
	}
	return whitespaceRunEnd(s, i)
}

// whitespaceRunEnd is where \s+(?!\S)|\s+ ends a match that starts at the
// whitespace character at i: the whole run when it ends the text, else the
// run less its last character (that one goes with the next word), else, for
// a run of one, that one character.
func whitespaceRunEnd(s string, i int) int {
	j, last := i, i
	for j < len(s) {
		r, size := utf8.DecodeRuneInString(s[j:])
		if !isRustWhitespace(r) {
			break
		}
		last = j
		j += size
	}
	if j == len(s) || last == i {
		return j
	}
	return last
}
