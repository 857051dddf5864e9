package schema

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
)

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
