package schema

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// Seed (upper-case) column names. The seed data set was exported from a
// warehouse table, so its columns arrive in upper case.
const (
	colCallID      = "CALL_ID"
	colEntityID    = "ENTITY_ID"
	colCompanyName = "COMPANY_NAME"
	colCallName    = "CALL_NAME"
	colDate        = "DATE"
	colVersionID   = "VERSION_ID"
	colEventTime   = "EVENT_DATETIME_UTC"
)

// seedSections lists the upper-case columns that hold sentences; the column
// name becomes the section name.
var seedSections = [...]string{"FILT_MD", "FILT_QA"}

// DecodeEvent parses and validates one input record. It accepts three wire
// shapes: the lower-case TranscriptEvent JSON, the seed's columns (FILT_* as
// a JSON array of strings or a string holding a Python list literal, see
// ParsePythonList; column names in any letter case, section names upper
// case), and a Kafka Connect JsonConverter envelope
// ({"schema":…,"payload":…}) around either. The returned event has already
// passed every check (the "valid encoding" idea: nothing downstream
// re-validates):
//   - the raw bytes are valid UTF-8 (checked before encoding/json, which would
//     silently replace bad bytes with U+FFFD) and within lim.MaxMessageBytes;
//   - call_id is a non-empty string (numbers are accepted and kept as their
//     literal text, as the seed's ID columns sometimes are numeric);
//   - every section value is an array of strings and there is at least one
//     sentence overall;
//   - lim's sentence, field and section bounds hold.
//
// Empty sentences and sentences containing NUL (U+0000, which JSON can only
// carry escaped as \u0000) are kept and scored unchanged: dropping or
// rewriting them would shift sentence_index against the source, and both are
// valid UTF-8. Sinks that reject NUL in text (PostgreSQL) must handle it.
//
// A Debezium change event (see DecodeRecord) is accepted too; a delete
// event has no transcript and is an error here (DecodeRecord returns it as
// a Delete).
//
// Every error is a *DecodeError wrapping ErrInvalidEvent.
func DecodeEvent(data []byte, lim Limits) (TranscriptEvent, error) {
	ev, del, err := decodeValue(nil, data, lim)
	if err == nil && del != nil {
		return TranscriptEvent{}, decodeErr(ReasonWrongType, "op", "a delete event has no transcript to score")
	}
	return ev, err
}

// decodeValue is DecodeEvent returning a Debezium delete event as a Delete;
// key is the record key, the call of a delete event without "before".
func decodeValue(key, data []byte, lim Limits) (ev TranscriptEvent, del *Delete, err error) {
	lim = lim.effective()
	if exceeds(len(data), lim.MaxMessageBytes) {
		return TranscriptEvent{}, nil, decodeErr(ReasonTooLarge, "", "message is %d bytes, limit %d", len(data), lim.MaxMessageBytes)
	}
	if !utf8.Valid(data) {
		return TranscriptEvent{}, nil, &DecodeError{Reason: ReasonInvalidUTF8, Err: fmt.Errorf("invalid UTF-8 at byte %d", firstInvalidUTF8(data))}
	}
	if off := loneSurrogateEscape(data); off >= 0 {
		return TranscriptEvent{}, nil, &DecodeError{Reason: ReasonInvalidUTF8, Err: fmt.Errorf("unpaired UTF-16 surrogate escape at byte %d", off)}
	}
	obj, err := decodeObject(data, "")
	if err != nil {
		return TranscriptEvent{}, nil, err
	}
	if _, isEnv := obj["payload"]; isEnv {
		if obj, err = unwrapEnvelope(obj); err != nil {
			return TranscriptEvent{}, nil, err
		}
	} else if _, isEnv := obj["schema"]; isEnv {
		return TranscriptEvent{}, nil, decodeErr(ReasonBadEnvelope, "payload", "envelope has \"schema\" but no \"payload\"")
	}
	if debezium(obj) {
		if obj, del, err = unwrapChange(key, obj); err != nil || del != nil {
			return TranscriptEvent{}, del, err
		}
	}
	_, hasSections := obj["sections"]
	switch {
	case hasSections:
		err = decodeLower(obj, &ev, lim)
	case hasSeedSection(obj):
		// Seed columns in any case: a JDBC source connector from
		// PostgreSQL, for one, lower-cases column names.
		if obj, err = upperKeys(obj); err == nil {
			err = decodeSeed(obj, &ev, lim)
		}
	default:
		if _, ok := obj["call_id"]; ok {
			err = decodeLower(obj, &ev, lim)
		} else {
			err = decodeSeed(obj, &ev, lim)
		}
	}
	if err != nil {
		return TranscriptEvent{}, nil, err
	}
	if err := validate(&ev, lim); err != nil {
		return TranscriptEvent{}, nil, err
	}
	return ev, nil, nil
}

func firstInvalidUTF8(b []byte) int {
	for i := 0; i < len(b); {
		r, size := utf8.DecodeRune(b[i:])
		if r == utf8.RuneError && size == 1 {
			return i
		}
		i += size
	}
	return -1
}

// decodeObject decodes data as one JSON object into raw fields. Trailing data
// after the object is malformed JSON, as json.Unmarshal would say.
func decodeObject(data []byte, field string) (map[string]json.RawMessage, error) {
	trimmed := bytes.TrimSpace(data)
	if len(trimmed) == 0 {
		return nil, decodeErr(ReasonMalformedJSON, field, "empty input")
	}
	if !json.Valid(trimmed) {
		var obj any
		err := json.Unmarshal(trimmed, &obj)
		return nil, &DecodeError{Reason: ReasonMalformedJSON, Field: field, Err: err}
	}
	if trimmed[0] != '{' {
		return nil, decodeErr(ReasonWrongType, field, "expected a JSON object, got %s", jsonKind(trimmed))
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(trimmed, &obj); err != nil {
		return nil, &DecodeError{Reason: ReasonMalformedJSON, Field: field, Err: err}
	}
	return obj, nil
}

func jsonKind(raw []byte) string {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 {
		return "nothing"
	}
	switch raw[0] {
	case '{':
		return "object"
	case '[':
		return "array"
	case '"':
		return "string"
	case 't', 'f':
		return "boolean"
	case 'n':
		return "null"
	default:
		return "number"
	}
}

func isNull(raw json.RawMessage) bool {
	return raw == nil || string(bytes.TrimSpace(raw)) == "null"
}

// unwrapEnvelope checks the JsonConverter envelope rules (exactly "schema"
// and "payload"; schema null or a struct/map schema object; payload an
// object) and returns the payload's fields.
func unwrapEnvelope(obj map[string]json.RawMessage) (map[string]json.RawMessage, error) {
	schemaRaw, hasSchema := obj["schema"]
	if !hasSchema {
		return nil, decodeErr(ReasonBadEnvelope, "schema", "envelope has \"payload\" but no \"schema\"")
	}
	if len(obj) != 2 {
		return nil, decodeErr(ReasonBadEnvelope, "", "envelope must have exactly the fields \"schema\" and \"payload\", has %d", len(obj))
	}
	if !isNull(schemaRaw) {
		if jsonKind(schemaRaw) != "object" {
			return nil, decodeErr(ReasonBadEnvelope, "schema", "schema must be an object or null, got %s", jsonKind(schemaRaw))
		}
		var s struct {
			Type *string `json:"type"`
		}
		if err := json.Unmarshal(schemaRaw, &s); err != nil || s.Type == nil {
			return nil, decodeErr(ReasonBadEnvelope, "schema.type", "schema has no string \"type\"")
		}
		if *s.Type != "struct" && *s.Type != "map" {
			return nil, decodeErr(ReasonBadEnvelope, "schema.type", "schema type %q cannot describe an object payload", *s.Type)
		}
	}
	payloadRaw := obj["payload"]
	if jsonKind(payloadRaw) != "object" {
		return nil, decodeErr(ReasonBadEnvelope, "payload", "payload must be an object, got %s", jsonKind(payloadRaw))
	}
	inner, err := decodeObject(payloadRaw, "payload")
	if err != nil {
		return nil, err
	}
	_, s := inner["schema"]
	_, p := inner["payload"]
	if s && p {
		return nil, decodeErr(ReasonBadEnvelope, "payload", "nested envelopes are not accepted")
	}
	return inner, nil
}

// scalar decodes an identity field that may be a string or a number (kept as
// its literal text). Absent and null give "".
func scalar(obj map[string]json.RawMessage, key string) (string, error) {
	raw, ok := obj[key]
	if !ok || isNull(raw) {
		return "", nil
	}
	switch jsonKind(raw) {
	case "string":
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return "", &DecodeError{Reason: ReasonMalformedJSON, Field: key, Err: err}
		}
		return s, nil
	case "number":
		return string(bytes.TrimSpace(raw)), nil
	default:
		return "", decodeErr(ReasonWrongType, key, "expected a string or number, got %s", jsonKind(raw))
	}
}

// stringOnly decodes a field that must be a JSON string (or absent/null).
func stringOnly(obj map[string]json.RawMessage, key string) (string, error) {
	raw, ok := obj[key]
	if !ok || isNull(raw) {
		return "", nil
	}
	if jsonKind(raw) != "string" {
		return "", decodeErr(ReasonWrongType, key, "expected a string, got %s", jsonKind(raw))
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return "", &DecodeError{Reason: ReasonMalformedJSON, Field: key, Err: err}
	}
	return s, nil
}

func decodeLower(obj map[string]json.RawMessage, ev *TranscriptEvent, lim Limits) error {
	var err error
	if ev.CallID, err = scalar(obj, "call_id"); err != nil {
		return err
	}
	if ev.EntityID, err = scalar(obj, "entity_id"); err != nil {
		return err
	}
	if ev.CompanyName, err = stringOnly(obj, "company_name"); err != nil {
		return err
	}
	if ev.CallName, err = stringOnly(obj, "call_name"); err != nil {
		return err
	}
	if ev.EventTime, err = stringOnly(obj, "event_time"); err != nil {
		return err
	}
	if ev.VersionID, err = scalar(obj, "version_id"); err != nil {
		return err
	}
	raw, ok := obj["sections"]
	if !ok || isNull(raw) {
		return decodeErr(ReasonMissingField, "sections", "sections is missing")
	}
	if jsonKind(raw) != "object" {
		return decodeErr(ReasonWrongType, "sections", "expected an object of section name to sentences, got %s", jsonKind(raw))
	}
	var secs map[string]json.RawMessage
	if err := json.Unmarshal(raw, &secs); err != nil {
		return &DecodeError{Reason: ReasonMalformedJSON, Field: "sections", Err: err}
	}
	if exceeds(len(secs), lim.MaxSections) {
		return decodeErr(ReasonTooLarge, "sections", "%d sections, limit %d", len(secs), lim.MaxSections)
	}
	ev.Sections = make(map[string][]string, len(secs))
	budget := newSentenceBudget(lim)
	for name, v := range secs {
		sents, err := sentences(v, "sections."+name, budget)
		if err != nil {
			return err
		}
		ev.Sections[name] = sents
	}
	return nil
}

// hasSeedSection reports whether obj has a seed sentence column (FILT_MD,
// FILT_QA) under any letter case.
func hasSeedSection(obj map[string]json.RawMessage) bool {
	for k := range obj {
		for _, col := range seedSections {
			if strings.EqualFold(k, col) {
				return true
			}
		}
	}
	return false
}

// upperKeys returns obj with its keys upper-cased, the seed's column case.
// Two keys that differ only in case are ambiguous and rejected.
func upperKeys(obj map[string]json.RawMessage) (map[string]json.RawMessage, error) {
	out := make(map[string]json.RawMessage, len(obj))
	for k, v := range obj {
		u := strings.ToUpper(k)
		if _, dup := out[u]; dup {
			return nil, decodeErr(ReasonWrongType, u, "column %q appears twice in different letter case", u)
		}
		out[u] = v
	}
	return out, nil
}

func decodeSeed(obj map[string]json.RawMessage, ev *TranscriptEvent, lim Limits) error {
	var err error
	if ev.CallID, err = scalar(obj, colCallID); err != nil {
		return err
	}
	if ev.EntityID, err = scalar(obj, colEntityID); err != nil {
		return err
	}
	if ev.CompanyName, err = stringOnly(obj, colCompanyName); err != nil {
		return err
	}
	if ev.CallName, err = stringOnly(obj, colCallName); err != nil {
		return err
	}
	if ev.VersionID, err = scalar(obj, colVersionID); err != nil {
		return err
	}
	if ev.EventTime, err = seedTime(obj, colEventTime, millisToTime); err != nil {
		return err
	}
	if ev.EventTime == "" {
		if ev.EventTime, err = seedTime(obj, colDate, daysToDate); err != nil {
			return err
		}
	}
	ev.Sections = make(map[string][]string, len(seedSections))
	budget := newSentenceBudget(lim)
	for _, col := range seedSections {
		raw, ok := obj[col]
		if !ok || isNull(raw) {
			continue
		}
		sents, err := sentences(raw, col, budget)
		if err != nil {
			return err
		}
		ev.Sections[col] = sents
	}
	return nil
}

// seedTime reads a time column: a string is kept verbatim; a number is the
// Connect logical-type encoding (Timestamp = epoch millis, Date = epoch days)
// and is rendered as RFC 3339 / YYYY-MM-DD in UTC.
func seedTime(obj map[string]json.RawMessage, key string, conv func(int64) string) (string, error) {
	raw, ok := obj[key]
	if !ok || isNull(raw) {
		return "", nil
	}
	switch jsonKind(raw) {
	case "string":
		return stringOnly(obj, key)
	case "number":
		n, err := strconv.ParseInt(string(bytes.TrimSpace(raw)), 10, 64)
		if err != nil {
			return "", decodeErr(ReasonWrongType, key, "expected an integer time, got %s", raw)
		}
		return conv(n), nil
	default:
		return "", decodeErr(ReasonWrongType, key, "expected a string or integer time, got %s", jsonKind(raw))
	}
}

func millisToTime(ms int64) string { return time.UnixMilli(ms).UTC().Format(time.RFC3339Nano) }

func daysToDate(d int64) string {
	return time.Unix(0, 0).UTC().AddDate(0, 0, int(d)).Format(time.DateOnly)
}

// sentenceBudget is what is left of lim.MaxSentences while an event's
// sections are decoded one after the other: each section is held to the
// remainder, so a record over the limit is rejected at the section that
// crosses it, before that section's sentences are built, and costs about
// its own size (not the size of every section decoded in full, the total
// checked last). Negative means no limit.
type sentenceBudget struct {
	left  int
	limit int
}

func newSentenceBudget(lim Limits) *sentenceBudget {
	return &sentenceBudget{left: lim.MaxSentences, limit: lim.MaxSentences}
}

// take spends n sentences of field; it fails, spending nothing, when fewer
// are left.
func (b *sentenceBudget) take(n int, field string) error {
	if b.left < 0 {
		return nil
	}
	if n > b.left {
		return b.exceeded(field)
	}
	b.left -= n
	return nil
}

func (b *sentenceBudget) exceeded(field string) error {
	return decodeErr(ReasonTooLarge, field, "more than %d sentences over all sections", b.limit)
}

// sentences decodes a section value: a JSON array of strings, or a string
// holding a Python list literal. It spends the section's sentences from
// budget, failing before it builds them when the budget is short.
func sentences(raw json.RawMessage, field string, budget *sentenceBudget) ([]string, error) {
	switch jsonKind(raw) {
	case "array":
		// raw is valid JSON (decodeObject checked the whole record), so
		// counting its elements needs no allocation.
		if err := budget.take(countArray(raw), field); err != nil {
			return nil, err
		}
		var elems []json.RawMessage
		if err := json.Unmarshal(raw, &elems); err != nil {
			return nil, &DecodeError{Reason: ReasonMalformedJSON, Field: field, Err: err}
		}
		out := make([]string, len(elems))
		for i, e := range elems {
			if jsonKind(e) != "string" {
				return nil, decodeErr(ReasonWrongType, fmt.Sprintf("%s[%d]", field, i), "expected a string sentence, got %s", jsonKind(e))
			}
			if err := json.Unmarshal(e, &out[i]); err != nil {
				return nil, &DecodeError{Reason: ReasonMalformedJSON, Field: fmt.Sprintf("%s[%d]", field, i), Err: err}
			}
		}
		return out, nil
	case "string":
		var lit string
		if err := json.Unmarshal(raw, &lit); err != nil {
			return nil, &DecodeError{Reason: ReasonMalformedJSON, Field: field, Err: err}
		}
		parsed, err := parsePythonList(lit, budget.left)
		if errors.Is(err, errTooManyElements) {
			return nil, budget.exceeded(field)
		}
		if err != nil {
			return nil, &DecodeError{Reason: ReasonWrongType, Field: field, Err: err}
		}
		return parsed, budget.take(len(parsed), field)
	default:
		return nil, decodeErr(ReasonWrongType, field, "expected an array of strings or a Python list literal, got %s", jsonKind(raw))
	}
}

// countArray counts the elements of raw, a valid JSON array, by its
// top-level commas.
func countArray(raw []byte) int {
	inner := bytes.TrimSpace(raw)
	inner = bytes.TrimSpace(inner[1 : len(inner)-1])
	if len(inner) == 0 {
		return 0
	}
	n, depth, inString := 1, 0, false
	for i := 0; i < len(inner); i++ {
		c := inner[i]
		if inString {
			switch c {
			case '\\':
				i++ // the escaped character, which may be a quote
			case '"':
				inString = false
			}
			continue
		}
		switch c {
		case '"':
			inString = true
		case '[', '{':
			depth++
		case ']', '}':
			depth--
		case ',':
			if depth == 0 {
				n++
			}
		}
	}
	return n
}

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
