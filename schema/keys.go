package schema

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
)

// EventKey is a result's key under OUTPUT_KEY=entity_event: the seed
// table's dedup key, ENTITY_ID + EVENT_DATETIME_UTC (event_time; the seed's
// DATE when EVENT_DATETIME_UTC is absent). A sink keyed on it keeps one
// record per company event whatever call_id the vendor gave each version.
type EventKey struct {
	EntityID  string `json:"entity_id"`
	EventTime string `json:"event_time"`
}

// EventRowKey is a row's key under OUTPUT_KEY=entity_event: RowKey with the
// call replaced by the seed's dedup key.
type EventRowKey struct {
	EntityID      string `json:"entity_id"`
	EventTime     string `json:"event_time"`
	Section       string `json:"section"`
	SentenceIndex int    `json:"sentence_index"`
	Label         string `json:"label"`
}

// ErrNoEventKey is returned when OUTPUT_KEY=entity_event and a record lacks
// entity_id or event_time, so it has no key.
var ErrNoEventKey = errors.New("schema: OUTPUT_KEY=entity_event needs entity_id and event_time")

// NewEventKey returns the entity_event key, or ErrNoEventKey (wrapped, with
// the call) when either part is empty.
func NewEventKey(callID, entityID, eventTime string) (EventKey, error) {
	if entityID == "" || eventTime == "" {
		return EventKey{}, fmt.Errorf("call %q has entity_id %q and event_time %q: %w", callID, entityID, eventTime, ErrNoEventKey)
	}
	return EventKey{EntityID: entityID, EventTime: eventTime}, nil
}

// EventRowKey returns r's key under OUTPUT_KEY=entity_event.
func (r *ScoreRow) EventRowKey() (EventRowKey, error) {
	if _, err := NewEventKey(r.CallID, r.EntityID, r.EventTime); err != nil {
		return EventRowKey{}, err
	}
	return EventRowKey{EntityID: r.EntityID, EventTime: r.EventTime, Section: r.Section, SentenceIndex: r.SentenceIndex, Label: r.Label}, nil
}

// EnvelopeEventKey returns k as a JsonConverter envelope (record_key).
func EnvelopeEventKey(k EventKey) ([]byte, error) {
	return envelope(eventKeySchema, k)
}

// EnvelopeEventRowKey returns k as a JsonConverter envelope (record_key).
func EnvelopeEventRowKey(k EventRowKey) ([]byte, error) {
	return envelope(eventRowKeySchema, k)
}

// deleteIdentity fills d's entity_id and event_time from a deleted row (a
// Debezium "before"), in either row shape, when it has them; a row without
// them leaves them empty (the delete can then only be keyed by call_id).
func deleteIdentity(d *Delete, row map[string]json.RawMessage) {
	for k := range row {
		switch {
		case strings.EqualFold(k, "entity_id"):
			d.EntityID, _ = scalar(row, k)
		case k == "event_time":
			d.EventTime, _ = stringOnly(row, k)
		case strings.EqualFold(k, colEventTime):
			if t, err := seedTime(map[string]json.RawMessage{colEventTime: row[k]}, colEventTime, millisToTime); err == nil {
				d.EventTime = t
			}
		}
	}
	if d.EventTime == "" {
		for k := range row {
			if strings.EqualFold(k, colDate) {
				if t, err := seedTime(map[string]json.RawMessage{colDate: row[k]}, colDate, daysToDate); err == nil {
					d.EventTime = t
				}
			}
		}
	}
}
