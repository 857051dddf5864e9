package tokenizer

import (
	"strings"
	"unicode"
	"unicode/utf8"
)

// addedToken is a token matched verbatim in the text before (or, when
// normalized is set, after) normalization, as HF's AddedVocabulary does, so
// literal "[MASK]" in a sentence becomes the [MASK] id rather than word pieces.
type addedToken struct {
	id         int32
	content    string
	singleWord bool
	lstrip     bool
	rstrip     bool
}

// addedMatcher finds added tokens with leftmost-longest semantics, the
// aho-corasick MatchKind HF builds its matcher with. The token set is tiny
// (a handful of specials), so repeated strings.Index beats a full automaton.
type addedMatcher struct {
	tokens []addedToken
}

// segment is a piece of the input: either an added token (id >= 0) or text
// still to be normalized and modelled (id < 0). start is its byte offset in
// the text it was cut from; Metaspace's "first" scheme needs it.
type segment struct {
	text  string
	id    int32
	start int
}

// split cuts text around every added-token match. Text pieces keep their
// offsets; empty text pieces are dropped as HF drops empty splits.
func (m *addedMatcher) split(text string, base int, out []segment) []segment {
	if len(m.tokens) == 0 {
		return append(out, segment{text: text, id: -1, start: base})
	}
	startOffset := 0
	pos := 0
	for pos < len(text) {
		mStart, mEnd, tok := m.next(text, pos)
		if tok == nil {
			break
		}
		pos = mEnd
		if tok.singleWord {
			startSpace := mStart == 0 || !endsWithWord(text[:mStart])
			stopSpace := mEnd == len(text) || !startsWithWord(text[mEnd:])
			if !startSpace || !stopSpace {
				// HF skips the match but keeps scanning after it.
				continue
			}
		}
		if tok.lstrip {
			ns := len(strings.TrimRightFunc(text[:mStart], unicode.IsSpace))
			mStart = max(ns, startOffset)
		}
		if tok.rstrip {
			rest := text[mEnd:]
			mEnd += len(rest) - len(strings.TrimLeftFunc(rest, unicode.IsSpace))
			pos = mEnd
		}
		if startOffset < mStart {
			out = append(out, segment{text: text[startOffset:mStart], id: -1, start: base + startOffset})
		}
		out = append(out, segment{text: text[mStart:mEnd], id: tok.id, start: base + mStart})
		startOffset = mEnd
	}
	if startOffset < len(text) {
		out = append(out, segment{text: text[startOffset:], id: -1, start: base + startOffset})
	}
	return out
}

// next finds the leftmost match at or after pos, preferring the longest
// token among those starting at the same byte.
func (m *addedMatcher) next(text string, pos int) (int, int, *addedToken) {
	best := -1
	var bestTok *addedToken
	for i := range m.tokens {
		tok := &m.tokens[i]
		if tok.content == "" {
			continue
		}
		limit := len(text)
		if best >= 0 {
			// A match starting after the current best cannot win.
			limit = min(len(text), best+len(tok.content))
		}
		j := strings.Index(text[pos:limit], tok.content)
		if j < 0 {
			continue
		}
		j += pos
		if best < 0 || j < best || (j == best && len(tok.content) > len(bestTok.content)) {
			best, bestTok = j, tok
		}
	}
	if bestTok == nil {
		return 0, 0, nil
	}
	return best, best + len(bestTok.content), bestTok
}

func isWordRune(r rune) bool {
	return r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r) || unicode.Is(unicode.M, r) || unicode.Is(unicode.Nl, r) || unicode.Is(unicode.Pc, r)
}

func endsWithWord(s string) bool {
	r, n := utf8.DecodeLastRuneInString(s)
	return n > 0 && isWordRune(r)
}

func startsWithWord(s string) bool {
	r, n := utf8.DecodeRuneInString(s)
	return n > 0 && isWordRune(r)
}
