package schema

import (
	"errors"
	"testing"
)

func TestDecodeRecordDeletesAndChanges(t *testing.T) {
	lim := DefaultLimits()
	for _, tc := range []struct {
		name       string
		key, value []byte
		wantCall   string // the event's call_id
		wantDelete string // the Delete's call_id
		wantReason Reason
	}{
		{name: "tombstone", key: []byte("CALL-1"), value: nil, wantDelete: "CALL-1"},
		{name: "tombstone with JSON key", key: []byte(`{"CALL_ID":"CALL-2"}`), wantDelete: "CALL-2"},
		{name: "tombstone with Connect key", key: []byte(`{"schema":{"type":"struct"},"payload":{"call_id":7}}`), wantDelete: "7"},
		{name: "tombstone with JSON string key", key: []byte(`"CALL-3"`), wantDelete: "CALL-3"},
		{name: "tombstone without key", key: nil, wantReason: ReasonMissingField},
		{name: "tombstone with JSON key lacking call_id", key: []byte(`{"id":1}`), wantReason: ReasonMissingField},
		{name: "empty non-nil value is not a tombstone", key: []byte("k"), value: []byte{}, wantReason: ReasonMalformedJSON},
		{name: "debezium create", value: []byte(`{"before":null,"after":{"call_id":"D1","sections":{"FILT_MD":["a"]}},"op":"c","ts_ms":1}`), wantCall: "D1"},
		{name: "debezium snapshot read, seed columns", value: []byte(`{"after":{"CALL_ID":"D2","FILT_MD":"['a', 'b']"},"op":"r"}`), wantCall: "D2"},
		{name: "debezium update in a Connect envelope", value: []byte(`{"schema":{"type":"struct"},"payload":{"before":{"call_id":"D3"},"after":{"call_id":"D3","sections":{"S":["x"]}},"op":"u"}}`), wantCall: "D3"},
		{name: "debezium delete", value: []byte(`{"before":{"CALL_ID":"D4","FILT_MD":"['a']"},"after":null,"op":"d"}`), wantDelete: "D4"},
		{name: "debezium delete without before uses the key", key: []byte("D5"), value: []byte(`{"before":null,"after":null,"op":"d"}`), wantDelete: "D5"},
		{name: "debezium update without after", value: []byte(`{"before":null,"after":null,"op":"u"}`), wantReason: ReasonMissingField},
		{name: "debezium unknown op", value: []byte(`{"after":{"call_id":"x","sections":{"S":["a"]}},"op":"t"}`), wantReason: ReasonWrongType},
		{name: "debezium after not an object", value: []byte(`{"after":"x","op":"c"}`), wantReason: ReasonWrongType},
		{name: "a plain event", value: []byte(`{"call_id":"P","sections":{"S":["a"]}}`), wantCall: "P"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ev, del, err := DecodeRecord(tc.key, tc.value, lim)
			if tc.wantReason != ReasonUnknown {
				var de *DecodeError
				if !errors.As(err, &de) || de.Reason != tc.wantReason || !errors.Is(err, ErrInvalidEvent) {
					t.Fatalf("err = %v, want reason %v", err, tc.wantReason)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			switch {
			case tc.wantDelete != "":
				if del == nil || del.CallID != tc.wantDelete || ev.CallID != "" {
					t.Fatalf("delete = %+v, event %q; want delete of %q", del, ev.CallID, tc.wantDelete)
				}
			default:
				if del != nil || ev.CallID != tc.wantCall {
					t.Fatalf("event %q, delete %+v; want event %q", ev.CallID, del, tc.wantCall)
				}
			}
		})
	}
}

// TestDecodeEventRejectsDelete: the offline path has no output to delete,
// so a Debezium delete event is an error there.
func TestDecodeEventRejectsDelete(t *testing.T) {
	_, err := DecodeEvent([]byte(`{"before":{"call_id":"x"},"after":null,"op":"d"}`), DefaultLimits())
	if !errors.Is(err, ErrInvalidEvent) {
		t.Fatalf("err = %v, want an invalid event", err)
	}
}

// TestDeleteCarriesEventIdentity: a Debezium delete's "before" row gives the
// delete its entity_id and event_time (seed columns: EVENT_DATETIME_UTC in
// epoch milliseconds), so it can be keyed as OUTPUT_KEY=entity_event.
func TestDeleteCarriesEventIdentity(t *testing.T) {
	for name, value := range map[string]string{
		"seed":  `{"before":{"CALL_ID":"C","ENTITY_ID":"WMT","EVENT_DATETIME_UTC":1708434000000},"after":null,"op":"d"}`,
		"lower": `{"before":{"call_id":"C","entity_id":"WMT","event_time":"2024-02-20T13:00:00Z"},"after":null,"op":"d"}`,
	} {
		_, del, err := DecodeRecord(nil, []byte(value), DefaultLimits())
		if err != nil || del == nil {
			t.Fatalf("%s: delete %v, err %v", name, del, err)
		}
		if *del != (Delete{CallID: "C", EntityID: "WMT", EventTime: "2024-02-20T13:00:00Z"}) {
			t.Errorf("%s: delete %+v", name, *del)
		}
	}
}
