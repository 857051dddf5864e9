package schema

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"
)

// PythonListError reports where and why ParsePythonList failed. Pos is a
// byte offset into the literal so a bad record can be located by hand.
type PythonListError struct {
	Pos int
	Msg string
}

// Error formats as "schema: python list at byte N: msg".
func (e *PythonListError) Error() string {
	return fmt.Sprintf("schema: python list at byte %d: %s", e.Pos, e.Msg)
}

// ParsePythonList parses a Python list-of-strings literal, the form the seed
// data's FILT_MD/FILT_QA columns take when a DataFrame is written with str()
// (e.g. `['a', "b's"]`). It exists because those strings are not JSON: they
// use single quotes and Python escapes.
//
// Accepted: surrounding whitespace; single- or double-quoted strings with an
// optional u/U or r/R prefix; triple-quoted strings; adjacent literals
// concatenated as Python does ('a' "b" == 'ab'); a trailing comma; the escapes
// \\ \' \" \a \b \f \n \r \t \v \ooo \xNN \uNNNN \UNNNNNNNN and
// backslash-newline; unknown escapes kept verbatim as Python does.
// Rejected: None and any non-string element (a missing sentence cannot be
// scored and dropping it would shift sentence indices), byte strings,
// unterminated strings, raw newlines in single-quoted strings, surrogate or
// out-of-range code points, and anything after the closing bracket.
func ParsePythonList(s string) ([]string, error) {
	p := pyParser{s: s, max: -1}
	return p.list()
}

// errTooManyElements is parsePythonList's error for a list longer than its
// cap.
var errTooManyElements = errors.New("schema: python list has more elements than allowed")

// parsePythonList is ParsePythonList with a cap on the number of elements
// (negative: none): past max it stops with errTooManyElements, so a literal
// of millions of empty strings costs no more than max of them.
func parsePythonList(s string, max int) ([]string, error) {
	p := pyParser{s: s, max: max}
	return p.list()
}

type pyParser struct {
	s   string
	pos int
	max int // most elements list accepts; negative = no cap
}

func (p *pyParser) errf(pos int, format string, args ...any) error {
	return &PythonListError{Pos: pos, Msg: fmt.Sprintf(format, args...)}
}

func (p *pyParser) skipSpace() {
	for p.pos < len(p.s) {
		switch p.s[p.pos] {
		case ' ', '\t', '\n', '\r', '\f', '\v':
			p.pos++
		default:
			return
		}
	}
}

func (p *pyParser) list() ([]string, error) {
	p.skipSpace()
	if p.pos >= len(p.s) || p.s[p.pos] != '[' {
		return nil, p.errf(p.pos, "expected '['")
	}
	p.pos++
	out := []string{}
	for {
		p.skipSpace()
		if p.pos >= len(p.s) {
			return nil, p.errf(p.pos, "unterminated list: expected ']'")
		}
		if p.s[p.pos] == ']' {
			p.pos++
			break
		}
		if p.max >= 0 && len(out) == p.max {
			return nil, errTooManyElements
		}
		elem, err := p.element()
		if err != nil {
			return nil, err
		}
		out = append(out, elem)
		p.skipSpace()
		if p.pos >= len(p.s) {
			return nil, p.errf(p.pos, "unterminated list: expected ',' or ']'")
		}
		switch p.s[p.pos] {
		case ',':
			p.pos++
		case ']':
			p.pos++
			p.skipSpace()
			if p.pos != len(p.s) {
				return nil, p.errf(p.pos, "unexpected %q after list", p.s[p.pos])
			}
			return out, nil
		default:
			return nil, p.errf(p.pos, "expected ',' or ']', got %q", p.s[p.pos])
		}
	}
	p.skipSpace()
	if p.pos != len(p.s) {
		return nil, p.errf(p.pos, "unexpected %q after list", p.s[p.pos])
	}
	return out, nil
}

// element parses one or more adjacent string literals.
func (p *pyParser) element() (string, error) {
	var b strings.Builder
	n := 0
	for {
		if n > 0 {
			p.skipSpace()
		}
		if p.pos >= len(p.s) || !p.atString() {
			break
		}
		if err := p.literal(&b); err != nil {
			return "", err
		}
		n++
	}
	if n == 0 {
		if strings.HasPrefix(p.s[p.pos:], "None") {
			return "", p.errf(p.pos, "None element: sentences must be strings")
		}
		return "", p.errf(p.pos, "expected a string literal")
	}
	return b.String(), nil
}

// atString reports whether a string literal (with optional prefix) starts here.
func (p *pyParser) atString() bool {
	i := p.pos
	for k := 0; k < 2 && i < len(p.s); k++ {
		switch p.s[i] {
		case 'u', 'U', 'r', 'R':
			i++
			continue
		}
		break
	}
	return i < len(p.s) && (p.s[i] == '\'' || p.s[i] == '"')
}

func (p *pyParser) literal(b *strings.Builder) error {
	start := p.pos
	raw, uni := false, false
	for p.pos < len(p.s) && p.s[p.pos] != '\'' && p.s[p.pos] != '"' {
		switch p.s[p.pos] {
		case 'r', 'R':
			if raw {
				return p.errf(start, "invalid string prefix")
			}
			raw = true
		case 'u', 'U':
			if uni {
				return p.errf(start, "invalid string prefix")
			}
			uni = true
		}
		p.pos++
	}
	if raw && uni {
		return p.errf(start, "invalid string prefix %q", p.s[start:p.pos])
	}
	q := p.s[p.pos]
	triple := strings.HasPrefix(p.s[p.pos:], strings.Repeat(string(q), 3))
	if triple {
		p.pos += 3
	} else {
		p.pos++
	}
	for {
		if p.pos >= len(p.s) {
			return p.errf(start, "unterminated string literal")
		}
		c := p.s[p.pos]
		switch {
		case c == q && !triple:
			p.pos++
			return nil
		case c == q && triple && strings.HasPrefix(p.s[p.pos:], strings.Repeat(string(q), 3)):
			p.pos += 3
			return nil
		case (c == '\n' || c == '\r') && !triple:
			return p.errf(p.pos, "newline in single-quoted string literal")
		case c == '\\':
			if raw {
				// In a raw string the backslash stays, but it still keeps the
				// next character (a quote) from ending the literal.
				b.WriteByte('\\')
				p.pos++
				if p.pos < len(p.s) {
					r, size := utf8.DecodeRuneInString(p.s[p.pos:])
					b.WriteRune(r)
					p.pos += size
				}
				continue
			}
			if err := p.escape(b); err != nil {
				return err
			}
		default:
			r, size := utf8.DecodeRuneInString(p.s[p.pos:])
			if r == utf8.RuneError && size == 1 {
				return p.errf(p.pos, "invalid UTF-8")
			}
			b.WriteString(p.s[p.pos : p.pos+size])
			p.pos += size
		}
	}
}

// escape decodes one backslash escape starting at p.pos (the backslash).
func (p *pyParser) escape(b *strings.Builder) error {
	at := p.pos
	p.pos++
	if p.pos >= len(p.s) {
		return p.errf(at, "unterminated escape")
	}
	c := p.s[p.pos]
	p.pos++
	switch c {
	case '\n':
		return nil // line continuation
	case '\r':
		if p.pos < len(p.s) && p.s[p.pos] == '\n' {
			p.pos++
		}
		return nil
	case '\\', '\'', '"':
		b.WriteByte(c)
	case 'a':
		b.WriteByte('\a')
	case 'b':
		b.WriteByte('\b')
	case 'f':
		b.WriteByte('\f')
	case 'n':
		b.WriteByte('\n')
	case 'r':
		b.WriteByte('\r')
	case 't':
		b.WriteByte('\t')
	case 'v':
		b.WriteByte('\v')
	case '0', '1', '2', '3', '4', '5', '6', '7':
		v := int(c - '0')
		for k := 0; k < 2 && p.pos < len(p.s) && p.s[p.pos] >= '0' && p.s[p.pos] <= '7'; k++ {
			v = v*8 + int(p.s[p.pos]-'0')
			p.pos++
		}
		b.WriteRune(rune(v))
	case 'x', 'u', 'U':
		n := 8 // \UNNNNNNNN
		switch c {
		case 'x':
			n = 2
		case 'u':
			n = 4
		}
		if p.pos+n > len(p.s) {
			return p.errf(at, "truncated \\%c escape", c)
		}
		v, err := strconv.ParseUint(p.s[p.pos:p.pos+n], 16, 32)
		if err != nil || strings.ContainsAny(p.s[p.pos:p.pos+n], "+-_") {
			return p.errf(at, "invalid \\%c escape %q", c, p.s[at:p.pos+n])
		}
		r := rune(v)
		if !utf8.ValidRune(r) {
			return p.errf(at, "escape %q is not a valid Unicode scalar value", p.s[at:p.pos+n])
		}
		p.pos += n
		b.WriteRune(r)
	default:
		// Python keeps unknown escapes verbatim ("\q" == "\\q").
		b.WriteByte('\\')
		p.pos--
	}
	return nil
}
