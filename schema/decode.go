package schema

import (
	"bytes"
	"encoding/json"
	"fmt"
	"unicode/utf8"
)

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
