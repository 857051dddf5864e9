package schema

import (
	"errors"
	"strings"
	"testing"
	"unicode/utf8"
)

// FuzzDecodeEvent checks that DecodeEvent never panics, that every error is
// a *DecodeError wrapping ErrInvalidEvent, and that every accepted event
// satisfies the validation invariants under small limits.
func FuzzDecodeEvent(f *testing.F) {
	for _, s := range []string{
		`{"call_id":"a","sections":{"FILT_MD":["x","y"],"FILT_QA":[]}}`,
		`{"CALL_ID":"a","VERSION_ID":2,"DATE":18000,"FILT_MD":"['x', \"y's\"]"}`,
		`{"schema":{"type":"struct"},"payload":{"call_id":"a","sections":{"S":["\u0000"]}}}`,
		`{"schema":null,"payload":{"CALL_ID":1,"FILT_QA":["\ud83d\ude00"]}}`,
		`{"call_id":"a","sections":{"S":["\ud800"]}}`,
		`[]`, `null`, `{}`, "\xff",
	} {
		f.Add([]byte(s))
	}
	lim := Limits{MaxMessageBytes: 1 << 16, MaxSentences: 50, MaxSentenceBytes: 64, MaxFieldBytes: 32, MaxSections: 4}
	f.Fuzz(func(t *testing.T, data []byte) {
		ev, err := DecodeEvent(data, lim)
		if err != nil {
			var de *DecodeError
			if !errors.As(err, &de) || !errors.Is(err, ErrInvalidEvent) {
				t.Fatalf("error %v (%T) is not a *DecodeError wrapping ErrInvalidEvent", err, err)
			}
			if de.Reason <= ReasonUnknown || de.Reason > ReasonBadEnvelope {
				t.Fatalf("bad reason %d", de.Reason)
			}
			return
		}
		if !utf8.Valid(data) {
			t.Fatalf("accepted invalid UTF-8 input")
		}
		if strings.TrimSpace(ev.CallID) == "" || len(ev.CallID) > lim.MaxFieldBytes {
			t.Fatalf("accepted call_id %q", ev.CallID)
		}
		if n := ev.SentenceCount(); n < 1 || n > lim.MaxSentences {
			t.Fatalf("accepted %d sentences", n)
		}
		if len(ev.Sections) > lim.MaxSections {
			t.Fatalf("accepted %d sections", len(ev.Sections))
		}
		for name, ss := range ev.Sections {
			if name == "" || !utf8.ValidString(name) {
				t.Fatalf("accepted section name %q", name)
			}
			for _, s := range ss {
				if len(s) > lim.MaxSentenceBytes || !utf8.ValidString(s) || strings.ContainsRune(s, utf8.RuneError) && !strings.Contains(string(data), "\uFFFD") && !strings.Contains(strings.ToLower(string(data)), `\ufffd`) {
					t.Fatalf("accepted sentence %q", s)
				}
			}
		}
	})
}

// FuzzPythonList checks that ParsePythonList never panics, returns valid
// UTF-8, and that what it returns survives a round trip through pyRepr.
func FuzzPythonList(f *testing.F) {
	for _, s := range []string{
		`[]`, `['a', "b's"]`, `['\x41\u00e9\U0001F600\n\\']`, `[u'a' 'b', r'\d',]`,
		`['''tri'ple''']`, `['a', None]`, `['\ud800']`, `['\777']`, "['\\\n']",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		got, err := ParsePythonList(in)
		if err != nil {
			var pe *PythonListError
			if !errors.As(err, &pe) || pe.Pos < 0 || pe.Pos > len(in) {
				t.Fatalf("bad error %v", err)
			}
			return
		}
		for _, s := range got {
			if !utf8.ValidString(s) {
				t.Fatalf("invalid UTF-8 element %q from %q", s, in)
			}
		}
		back, err := ParsePythonList(pyRepr(got))
		if err != nil {
			t.Fatalf("re-parse of %q: %v", pyRepr(got), err)
		}
		if strings.Join(back, "\x00|") != strings.Join(got, "\x00|") || len(back) != len(got) {
			t.Fatalf("round trip %q -> %q", got, back)
		}
	})
}

// pyRepr renders a list the way Python's repr would (close enough for the
// round trip: every non-printable rune is \U-escaped).
func pyRepr(ss []string) string {
	var b strings.Builder
	b.WriteByte('[')
	for i, s := range ss {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteByte('\'')
		for _, r := range s {
			switch {
			case r == '\'' || r == '\\':
				b.WriteByte('\\')
				b.WriteRune(r)
			case r < 0x20 || r == 0x7f:
				b.WriteString(`\x`)
				b.WriteString(strings.ToLower(string("0123456789ABCDEF"[r>>4]) + string("0123456789ABCDEF"[r&15])))
			default:
				b.WriteRune(r)
			}
		}
		b.WriteByte('\'')
	}
	b.WriteByte(']')
	return b.String()
}
