package schema

import (
	"fmt"
	"strings"
	"unicode/utf8"
)

// validate enforces the invariants every decoded event satisfies whatever its
// wire shape; FuzzDecodeEvent re-checks them on every accepted input.
func validate(ev *TranscriptEvent, lim Limits) error {
	if strings.TrimSpace(ev.CallID) == "" {
		return decodeErr(ReasonMissingField, "call_id", "call_id is missing or blank")
	}
	for _, f := range [...]struct{ name, v string }{
		{"call_id", ev.CallID}, {"entity_id", ev.EntityID}, {"company_name", ev.CompanyName},
		{"call_name", ev.CallName}, {"event_time", ev.EventTime}, {"version_id", ev.VersionID},
	} {
		if exceeds(len(f.v), lim.MaxFieldBytes) {
			return decodeErr(ReasonTooLarge, f.name, "%d bytes, limit %d", len(f.v), lim.MaxFieldBytes)
		}
		if !utf8.ValidString(f.v) {
			return decodeErr(ReasonInvalidUTF8, f.name, "not valid UTF-8")
		}
	}
	if exceeds(len(ev.Sections), lim.MaxSections) {
		return decodeErr(ReasonTooLarge, "sections", "%d sections, limit %d", len(ev.Sections), lim.MaxSections)
	}
	total := 0
	for _, name := range ev.SectionNames() {
		if name == "" {
			return decodeErr(ReasonMissingField, "sections", "empty section name")
		}
		if exceeds(len(name), lim.MaxFieldBytes) {
			return decodeErr(ReasonTooLarge, "sections", "section name is %d bytes, limit %d", len(name), lim.MaxFieldBytes)
		}
		if !utf8.ValidString(name) {
			return decodeErr(ReasonInvalidUTF8, "sections", "section name is not valid UTF-8")
		}
		for i, s := range ev.Sections[name] {
			field := fmt.Sprintf("%s[%d]", name, i)
			if exceeds(len(s), lim.MaxSentenceBytes) {
				return decodeErr(ReasonTooLarge, field, "sentence is %d bytes, limit %d", len(s), lim.MaxSentenceBytes)
			}
			// Python \x/\u escapes and JSON \u escapes can produce strings
			// the raw-bytes check never saw; Go strings from both are valid
			// UTF-8 by construction, but check anyway so the invariant is
			// stated in one place.
			if !utf8.ValidString(s) {
				return decodeErr(ReasonInvalidUTF8, field, "sentence is not valid UTF-8")
			}
		}
		total += len(ev.Sections[name])
		if exceeds(total, lim.MaxSentences) {
			return decodeErr(ReasonTooLarge, "sections", "more than %d sentences", lim.MaxSentences)
		}
	}
	if total == 0 {
		return decodeErr(ReasonNoSentences, "sections", "no sentences in any section")
	}
	return nil
}

// loneSurrogateEscape returns the offset of the first \uD800–\uDFFF escape
// inside a JSON string that is not part of a high+low pair, or -1.
// encoding/json turns such escapes into U+FFFD without an error, which would
// silently change the text, so they are rejected like invalid UTF-8 bytes.
func loneSurrogateEscape(data []byte) int {
	inString := false
	for i := 0; i < len(data); i++ {
		c := data[i]
		if !inString {
			if c == '"' {
				inString = true
			}
			continue
		}
		switch c {
		case '"':
			inString = false
		case '\\':
			if i+1 >= len(data) {
				return -1
			}
			if data[i+1] != 'u' {
				i++ // skip the escaped character (it may be a quote)
				continue
			}
			r, ok := hex4(data, i+2)
			if !ok {
				i++
				continue
			}
			switch {
			case r >= 0xD800 && r <= 0xDBFF:
				if i+7 < len(data) && data[i+6] == '\\' && data[i+7] == 'u' {
					if lo, ok := hex4(data, i+8); ok && lo >= 0xDC00 && lo <= 0xDFFF {
						i += 11
						continue
					}
				}
				return i
			case r >= 0xDC00 && r <= 0xDFFF:
				return i
			}
			i += 5
		}
	}
	return -1
}

func hex4(data []byte, at int) (rune, bool) {
	if at+4 > len(data) {
		return 0, false
	}
	var r rune
	for _, c := range data[at : at+4] {
		switch {
		case c >= '0' && c <= '9':
			r = r<<4 | rune(c-'0')
		case c >= 'a' && c <= 'f':
			r = r<<4 | rune(c-'a'+10)
		case c >= 'A' && c <= 'F':
			r = r<<4 | rune(c-'A'+10)
		default:
			return 0, false
		}
	}
	return r, true
}
