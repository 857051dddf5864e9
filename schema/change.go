package schema

import (
	"bytes"
	"encoding/json"
	"strings"
	"unicode/utf8"
)

// Delete says that an input record deletes a call rather than carrying a
// version of it: a tombstone (a key with a null value, what a compacted
// topic or a CDC source emits for a deleted row) or a Debezium delete event
// (op "d"). The scorer forwards it as a tombstone for CallID on the output
// topic, so a compacted output topic and a JDBC sink with
// delete.enabled=true drop the scored record too.
//
// EntityID and EventTime are set when the deleted row is known (a Debezium
// delete's "before"), so that the delete can also be keyed as
// OUTPUT_KEY=entity_event; a plain tombstone carries only the call.
type Delete struct {
	CallID    string
	EntityID  string
	EventTime string
}

// DecodeRecord decodes one input record, key and value. A nil value is a
// tombstone: its key names the call (see CallIDFromKey). Otherwise the value
// is decoded as DecodeEvent does, and a Debezium change event
// ({"before":…,"after":…,"op":…}, bare or in a JsonConverter envelope) is
// accepted too: op c, r or u score "after"; op d is a Delete of the call in
// "before" (or, when "before" is absent or null, the key's). Exactly one of
// the event and the Delete is returned on success. Every error is a
// *DecodeError wrapping ErrInvalidEvent.
func DecodeRecord(key, value []byte, lim Limits) (TranscriptEvent, *Delete, error) {
	if value == nil {
		id, err := CallIDFromKey(key)
		if err != nil {
			return TranscriptEvent{}, nil, err
		}
		return TranscriptEvent{}, &Delete{CallID: id}, nil
	}
	return decodeValue(key, value, lim)
}

// CallIDFromKey reads the call_id a record key names: the key's text, or,
// for a JSON key (a JsonConverter or Debezium key such as
// {"call_id":"X"}, {"CALL_ID":"X"}, optionally in a {"schema","payload"}
// envelope, or a JSON string "X"), its call_id field in any letter case.
func CallIDFromKey(key []byte) (string, error) {
	trimmed := bytes.TrimSpace(key)
	if len(trimmed) == 0 {
		return "", decodeErr(ReasonMissingField, "key", "a tombstone or delete needs a key naming the call")
	}
	if !utf8.Valid(trimmed) {
		return "", decodeErr(ReasonInvalidUTF8, "key", "key is not valid UTF-8")
	}
	switch trimmed[0] {
	case '"':
		var s string
		if json.Unmarshal(trimmed, &s) == nil && s != "" {
			return s, nil
		}
	case '{':
		obj, err := decodeObject(trimmed, "key")
		if err != nil {
			return "", err
		}
		if p, ok := obj["payload"]; ok && jsonKind(p) == "object" {
			if obj, err = decodeObject(p, "key.payload"); err != nil {
				return "", err
			}
		}
		return callIDOf(obj, "key")
	}
	return string(key), nil
}

// callIDOf reads call_id from obj, its name in any letter case.
func callIDOf(obj map[string]json.RawMessage, field string) (string, error) {
	for k := range obj {
		if strings.EqualFold(k, "call_id") {
			id, err := scalar(obj, k)
			if err != nil {
				return "", err
			}
			if id != "" {
				return id, nil
			}
		}
	}
	return "", decodeErr(ReasonMissingField, field, "no call_id in %s", field)
}

// debezium recognises a Debezium change event among an input's fields: it
// has "op" and at least one of "before" and "after".
func debezium(obj map[string]json.RawMessage) bool {
	_, op := obj["op"]
	_, before := obj["before"]
	_, after := obj["after"]
	return op && (before || after)
}

// unwrapChange returns the row fields of a Debezium create, read or update
// event (its "after"), or the Delete of a delete event.
func unwrapChange(key []byte, obj map[string]json.RawMessage) (map[string]json.RawMessage, *Delete, error) {
	op, err := stringOnly(obj, "op")
	if err != nil {
		return nil, nil, err
	}
	switch op {
	case "c", "r", "u":
		after := obj["after"]
		if isNull(after) {
			return nil, nil, decodeErr(ReasonMissingField, "after", "change event op %q has no \"after\"", op)
		}
		if jsonKind(after) != "object" {
			return nil, nil, decodeErr(ReasonWrongType, "after", "expected an object, got %s", jsonKind(after))
		}
		row, err := decodeObject(after, "after")
		return row, nil, err
	case "d":
		if before := obj["before"]; !isNull(before) {
			if jsonKind(before) != "object" {
				return nil, nil, decodeErr(ReasonWrongType, "before", "expected an object, got %s", jsonKind(before))
			}
			row, err := decodeObject(before, "before")
			if err != nil {
				return nil, nil, err
			}
			id, err := callIDOf(row, "before")
			if err != nil {
				return nil, nil, err
			}
			d := &Delete{CallID: id}
			deleteIdentity(d, row)
			return nil, d, nil
		}
		id, err := CallIDFromKey(key)
		if err != nil {
			return nil, nil, err
		}
		return nil, &Delete{CallID: id}, nil
	default:
		return nil, nil, decodeErr(ReasonWrongType, "op", "unknown change event op %q (want c, r, u or d)", op)
	}
}
