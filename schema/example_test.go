package schema_test

import (
	"errors"
	"fmt"

	"github.com/scorer/scorer/schema"
)

// DecodeEvent is the one way input becomes a TranscriptEvent, within
// Limits; what it refuses wraps ErrInvalidEvent with a Reason, the class a
// dead letter and scorer_dlq_total carry.
func ExampleDecodeEvent() {
	lim := schema.DefaultLimits()
	lim.MaxSentences = 2

	ev, err := schema.DecodeEvent([]byte(`{"call_id":"A-2020-Q4","sections":{"FILT_MD":["Demand held up.","Thank you."]}}`), lim)
	fmt.Println(ev.CallID, ev.SentenceCount(), err)

	_, err = schema.DecodeEvent([]byte(`{"call_id":"B","sections":{"FILT_MD":["One.","Two.","Three."]}}`), lim)
	var de *schema.DecodeError
	fmt.Println(errors.Is(err, schema.ErrInvalidEvent), errors.As(err, &de) && de.Reason == schema.ReasonTooLarge)
	// Output:
	// A-2020-Q4 2 <nil>
	// true true
}
