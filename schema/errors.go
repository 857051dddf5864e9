package schema

import (
	"errors"
	"fmt"
)

// ErrInvalidEvent is the sentinel every DecodeEvent failure wraps, so callers
// can tell "this input can never be scored, dead-letter it" apart from
// transient failures with a single errors.Is check.
var ErrInvalidEvent = errors.New("schema: invalid event")

// Reason classifies why DecodeEvent rejected an input. It is a small closed
// enum (like kgo's LogLevel) so that DLQ headers and the scorer_dlq_total
// metric use a fixed, low-cardinality vocabulary.
type Reason int

// The reasons DecodeEvent can report. ReasonUnknown is the zero value and is
// never returned by DecodeEvent; it exists so an unset Reason is visible.
const (
	ReasonUnknown Reason = iota
	// ReasonMalformedJSON: the bytes are not one JSON value.
	ReasonMalformedJSON
	// ReasonWrongType: a field has the wrong JSON type (or an unparsable
	// Python list literal).
	ReasonWrongType
	// ReasonMissingField: a required field (call_id) is absent, null or empty.
	ReasonMissingField
	// ReasonNoSentences: the event has no sentence in any section.
	ReasonNoSentences
	// ReasonInvalidUTF8: the raw input or a decoded string is not valid UTF-8.
	ReasonInvalidUTF8
	// ReasonTooLarge: a Limits bound was exceeded.
	ReasonTooLarge
	// ReasonBadEnvelope: the input looks like a Connect envelope but is not a
	// valid one.
	ReasonBadEnvelope
)

// reasonNames is a read-only table; index = Reason.
var reasonNames = [...]string{
	ReasonUnknown:       "unknown",
	ReasonMalformedJSON: "malformed_json",
	ReasonWrongType:     "wrong_type",
	ReasonMissingField:  "missing_field",
	ReasonNoSentences:   "no_sentences",
	ReasonInvalidUTF8:   "invalid_utf8",
	ReasonTooLarge:      "too_large",
	ReasonBadEnvelope:   "bad_envelope",
}

// String returns the snake_case name used in the scorer.dlq.reason header and
// metric labels.
func (r Reason) String() string {
	if r >= 0 && int(r) < len(reasonNames) {
		return reasonNames[r]
	}
	return fmt.Sprintf("reason(%d)", int(r))
}

// DecodeError is the error DecodeEvent returns. Reason is the machine-readable
// class, Field names the offending input field ("" when the whole input is at
// fault, e.g. "FILT_QA[3]" for one sentence), and Err carries the detail.
// It unwraps to both ErrInvalidEvent and Err.
type DecodeError struct {
	Reason Reason
	Field  string
	Err    error
}

// Error formats as "schema: invalid event: <reason> [field <f>]: <detail>".
func (e *DecodeError) Error() string {
	msg := "schema: invalid event: " + e.Reason.String()
	if e.Field != "" {
		msg += " field " + e.Field
	}
	if e.Err != nil {
		msg += ": " + e.Err.Error()
	}
	return msg
}

// Unwrap exposes ErrInvalidEvent (for errors.Is) and the underlying cause.
func (e *DecodeError) Unwrap() []error {
	if e.Err == nil {
		return []error{ErrInvalidEvent}
	}
	return []error{ErrInvalidEvent, e.Err}
}

func decodeErr(r Reason, field string, format string, args ...any) *DecodeError {
	return &DecodeError{Reason: r, Field: field, Err: fmt.Errorf(format, args...)}
}
