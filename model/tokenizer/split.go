package tokenizer

import (
	"fmt"
	"regexp"
	"strings"
	"unicode/utf8"
)

// Split behaviours: what becomes of each match (HF's SplitDelimiterBehavior).
const (
	splitRemoved = iota
	splitIsolated
	splitMergedWithPrevious
	splitMergedWithNext
	splitContiguous
)

var splitBehaviors = map[string]int{
	"Removed":            splitRemoved,
	"Isolated":           splitIsolated,
	"MergedWithPrevious": splitMergedWithPrevious,
	"MergedWithNext":     splitMergedWithNext,
	"Contiguous":         splitContiguous,
}

// splitPre is HF's Split pre-tokenizer: cut at the matches of a pattern
// (a literal, or a regex written for Oniguruma and translated by
// translateRegex), keeping, dropping or merging the matches by behavior;
// invert swaps what counts as a match.
type splitPre struct {
	m        matcher
	behavior int
	invert   bool
}

// span is a piece of text [start, end) and whether the pattern matched it.
type span struct {
	start, end int
	match      bool
}

func (p splitPre) split(text string, _ bool, out []string) []string {
	if text == "" {
		return out
	}
	spans := p.m.find(text, nil)
	if p.invert {
		for i := range spans {
			spans[i].match = !spans[i].match
		}
	}
	type piece struct {
		start, end int
		remove     bool
	}
	var pieces []piece
	prevMatch := false
	switch p.behavior {
	case splitRemoved, splitIsolated:
		for _, s := range spans {
			pieces = append(pieces, piece{s.start, s.end, s.match && p.behavior == splitRemoved})
		}
	case splitContiguous:
		for _, s := range spans {
			if s.match == prevMatch && len(pieces) > 0 {
				pieces[len(pieces)-1].end = s.end
			} else {
				pieces = append(pieces, piece{s.start, s.end, false})
			}
			prevMatch = s.match
		}
	case splitMergedWithPrevious:
		for _, s := range spans {
			if s.match && !prevMatch && len(pieces) > 0 {
				pieces[len(pieces)-1].end = s.end
			} else {
				pieces = append(pieces, piece{s.start, s.end, false})
			}
			prevMatch = s.match
		}
	case splitMergedWithNext:
		for i := len(spans) - 1; i >= 0; i-- {
			s := spans[i]
			if s.match && !prevMatch && len(pieces) > 0 {
				pieces[len(pieces)-1].start = s.start
			} else {
				pieces = append(pieces, piece{s.start, s.end, false})
			}
			prevMatch = s.match
		}
		for i, j := 0, len(pieces)-1; i < j; i, j = i+1, j-1 {
			pieces[i], pieces[j] = pieces[j], pieces[i]
		}
	}
	for _, pc := range pieces {
		if !pc.remove && pc.end > pc.start {
			out = append(out, text[pc.start:pc.end])
		}
	}
	return out
}

// matcher finds a pattern's matches in text, left to right without
// overlap, and returns the text tiled into matched and unmatched spans (HF's
// Pattern::find_matches).
type matcher interface {
	find(text string, out []span) []span
}

type literalMatcher string

func (m literalMatcher) find(text string, out []span) []span {
	prev := 0
	if m != "" {
		for i := 0; i <= len(text)-len(m); {
			j := strings.Index(text[i:], string(m))
			if j < 0 {
				break
			}
			j += i
			if prev != j {
				out = append(out, span{prev, j, false})
			}
			out = append(out, span{j, j + len(m), true})
			prev, i = j+len(m), j+len(m)
		}
	}
	if prev != len(text) {
		out = append(out, span{prev, len(text), false})
	}
	return out
}

// regexMatcher is a translated regex, plus, when the pattern ends with
// GPT-2's \s+(?!\S) (optionally followed by \s+), those alternatives
// matched by hand since Go's regexp has no lookahead.
type regexMatcher struct {
	re       *regexp.Regexp // nil when only the whitespace alternatives remain
	wsTail   bool           // \s+(?!\S) is the next-to-last or last alternative
	wsPlusOK bool           // and \s+ follows it
}

func (m regexMatcher) find(text string, out []span) []span {
	prev := 0
	add := func(s, e int) {
		if prev != s {
			out = append(out, span{prev, s, false})
		}
		out = append(out, span{s, e, true})
		prev = e
	}
	if !m.wsTail {
		for _, loc := range m.re.FindAllStringIndex(text, -1) {
			if loc[1] > loc[0] {
				add(loc[0], loc[1])
			}
		}
	} else {
		// The regex's leftmost match at or after pos, kept while it is
		// still ahead: a match's start does not depend on where the search
		// began (the patterns have no anchors or lookbehind).
		reStart, reEnd, searched := -1, -1, false
		for pos := 0; pos < len(text); {
			if m.re != nil && (!searched || (reStart >= 0 && reStart < pos)) {
				reStart, searched = -1, true
				if loc := m.re.FindStringIndex(text[pos:]); loc != nil {
					reStart, reEnd = pos+loc[0], pos+loc[1]
				}
			}
			ws, wsEnd := m.nextWhitespace(text, pos, reStart)
			switch {
			case ws >= 0:
				add(ws, wsEnd)
				pos = wsEnd
			case reStart < 0:
				pos = len(text)
			case reEnd == reStart:
				// An empty match makes no piece; the search goes on a
				// character later, as Oniguruma's find_iter does.
				_, size := utf8.DecodeRuneInString(text[reStart:])
				pos, searched = reStart+max(size, 1), false
			default:
				add(reStart, reEnd)
				pos = reEnd
			}
		}
	}
	if prev != len(text) {
		out = append(out, span{prev, len(text), false})
	}
	return out
}

// nextWhitespace is the first match of the hand-written whitespace
// alternatives that starts at or after pos and before limit (when limit >=
// 0: the regex's own match wins from there, its alternatives come first).
func (m regexMatcher) nextWhitespace(text string, pos, limit int) (int, int) {
	for i, r := range text[pos:] {
		i += pos
		if limit >= 0 && i >= limit {
			break
		}
		if !isRustWhitespace(r) {
			continue
		}
		end := whitespaceRunEnd(text, i)
		if !m.wsPlusOK && end < len(text) && end-i == utf8.RuneLen(r) && !isRustWhitespace(runeAt(text, end)) {
			// A lone whitespace before a non-space: only \s+ would match.
			continue
		}
		return i, end
	}
	return -1, 0
}

func runeAt(s string, i int) rune {
	r, _ := utf8.DecodeRuneInString(s[i:])
	return r
}

// unicodeSpace is the White_Space property as a class body: what
// Oniguruma's \s means on UTF-8 text. Go's \s is ASCII only.
const unicodeSpace = `\t-\r \x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000}`

// unicodeWord is Oniguruma's Unicode \w: letters, marks, decimal digits
// and connector punctuation.
const unicodeWord = `\p{L}\p{M}\p{Nd}\p{Pc}`

const wsTailAlt = `\s+(?!\S)`

// translateRegex turns an Oniguruma pattern, as HF's Split stores it, into
// Go regexp syntax with the same meaning: \s, \d and \w become their
// Unicode classes (Go's are ASCII), and GPT-2's trailing \s+(?!\S)|\s+ is
// cut off for regexMatcher to match by hand. Anything Go cannot express
// the same way (other lookarounds, \b, \S inside a class, possessive or
// atomic groups) is an error naming it.
func translateRegex(pat string) (regexMatcher, error) {
	alts := topLevelAlternatives(pat)
	var m regexMatcher
	switch {
	case len(alts) >= 2 && alts[len(alts)-2] == wsTailAlt && alts[len(alts)-1] == `\s+`:
		m.wsTail, m.wsPlusOK = true, true
		alts = alts[:len(alts)-2]
	case len(alts) >= 1 && alts[len(alts)-1] == wsTailAlt:
		m.wsTail = true
		alts = alts[:len(alts)-1]
	}
	if len(alts) == 0 {
		return m, nil
	}
	var b strings.Builder
	for i, a := range alts {
		if i > 0 {
			b.WriteByte('|')
		}
		t, err := translateAlt(a)
		if err != nil {
			return m, err
		}
		b.WriteString(t)
	}
	re, err := regexp.Compile(b.String())
	if err != nil {
		return m, fmt.Errorf("it does not compile as a Go regexp: %w", err)
	}
	m.re = re
	return m, nil
}

// topLevelAlternatives splits a pattern at the | outside groups and classes.
func topLevelAlternatives(pat string) []string {
	var alts []string
	depth, inClass, start := 0, false, 0
	for i := 0; i < len(pat); i++ {
		switch c := pat[i]; {
		case c == '\\':
			i++
		case inClass:
			if c == ']' {
				inClass = false
			}
		case c == '[':
			inClass = true
			if i+1 < len(pat) && pat[i+1] == '^' {
				i++
			}
			if i+1 < len(pat) && pat[i+1] == ']' {
				i++
			}
		case c == '(':
			depth++
		case c == ')':
			depth--
		case c == '|' && depth == 0:
			alts = append(alts, pat[start:i])
			start = i + 1
		}
	}
	return append(alts, pat[start:])
}

func translateAlt(a string) (string, error) {
	var b strings.Builder
	inClass := false
	for i := 0; i < len(a); i++ {
		c := a[i]
		switch {
		case c == '\\' && i+1 < len(a):
			e := a[i+1]
			i++
			switch e {
			case 's':
				if inClass {
					b.WriteString(unicodeSpace)
				} else {
					b.WriteString("[" + unicodeSpace + "]")
				}
			case 'S':
				if inClass {
					return "", fmt.Errorf(`\S inside a character class is not supported`)
				}
				b.WriteString("[^" + unicodeSpace + "]")
			case 'd':
				b.WriteString(`\p{Nd}`)
			case 'w':
				if inClass {
					b.WriteString(unicodeWord)
				} else {
					b.WriteString("[" + unicodeWord + "]")
				}
			case 'p', 'P':
				// A property class, copied whole so its closing brace is
				// not read as a repetition's.
				end := i + 1
				if i+1 < len(a) && a[i+1] == '{' {
					if j := strings.IndexByte(a[i+1:], '}'); j >= 0 {
						end = i + 1 + j + 1
					}
				}
				b.WriteString(a[i-1 : end])
				i = end - 1
			case 'D', 'W', 'b', 'B', 'h', 'H', 'R', 'X', 'K', 'G', 'k', 'g':
				return "", fmt.Errorf(`\%c is not supported`, e)
			default:
				b.WriteByte('\\')
				b.WriteByte(e)
			}
		case inClass:
			if c == ']' {
				inClass = false
			}
			b.WriteByte(c)
		case c == '[':
			inClass = true
			b.WriteByte(c)
			if i+1 < len(a) && a[i+1] == '^' {
				b.WriteByte('^')
				i++
			}
			if i+1 < len(a) && a[i+1] == ']' {
				b.WriteByte(']')
				i++
			}
		case c == '(' && strings.HasPrefix(a[i:], "(?=") || strings.HasPrefix(a[i:], "(?!") || strings.HasPrefix(a[i:], "(?<") || strings.HasPrefix(a[i:], "(?>"):
			return "", fmt.Errorf("lookaround or atomic group %q is not supported (only a final \\s+(?!\\S) alternative is)", a[i:min(len(a), i+4)])
		case (c == '+' || c == '?' || c == '*' || c == '}') && i+1 < len(a) && a[i+1] == '+':
			return "", fmt.Errorf("possessive quantifier %q is not supported", a[i:i+2])
		default:
			b.WriteByte(c)
		}
	}
	return b.String(), nil
}
