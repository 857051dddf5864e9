package producer

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/scorer/scorer/schema"
)

// TestEntityEventKeys: under KeyEntityEvent results, rows and tombstones
// are keyed by the seed's dedup key (entity_id + event_time), in JSON and
// in Connect envelopes; a transcript or a plain tombstone without both
// parts is reported, not written under a made-up key.
func TestEntityEventKeys(t *testing.T) {
	t.Parallel()
	for _, format := range []string{FormatJSON, FormatConnect} {
		t.Run(format, func(t *testing.T) {
			t.Parallel()
			c := newCluster(t)
			cfg := testConfig(c)
			cfg.Key, cfg.Format = KeyEntityEvent, format
			p := newProducer(t, cfg)
			noEntity := sample("no-entity")
			noEntity.EntityID = ""
			err := p.Publish(t.Context(), []schema.ScoredTranscript{sample("v1"), noEntity})
			var pe *PermanentError
			if !errors.As(err, &pe) || len(pe.Indexes) != 1 || pe.Indexes[0] != 1 || !errors.Is(err, schema.ErrNoEventKey) {
				t.Fatalf("Publish = %v, want a PermanentError naming index 1 (no entity_id)", err)
			}
			err = p.Delete(t.Context(), []schema.Delete{{CallID: "plain"}, {CallID: "dbz", EntityID: "E", EventTime: "2024-01-02T03:04:05Z"}})
			if !errors.As(err, &pe) || len(pe.Indexes) != 1 || pe.Indexes[0] != 0 {
				t.Fatalf("Delete = %v, want a PermanentError naming index 0 (a plain tombstone)", err)
			}
			// payload unwraps a Connect envelope; JSON keys are the object.
			payload := func(b []byte) map[string]any {
				var m map[string]any
				if err := json.Unmarshal(b, &m); err != nil {
					t.Fatalf("key %q: %v", b, err)
				}
				if format == FormatConnect {
					m, _ = m["payload"].(map[string]any)
				}
				return m
			}
			recs := readAll(t, c, topicOut, 2) // v1's result and dbz's tombstone
			if len(recs) != 2 {
				t.Fatalf("%d records on the output, want 2", len(recs))
			}
			for _, r := range recs {
				k := payload(r.Key)
				if k["entity_id"] != "E" || k["event_time"] != "2024-01-02T03:04:05Z" || len(k) != 2 {
					t.Errorf("output key %s, want entity_id E and event_time only", r.Key)
				}
			}
			if recs[0].Value == nil || recs[1].Value != nil {
				t.Errorf("want the result then the tombstone, got values %d and %d bytes", len(recs[0].Value), len(recs[1].Value))
			}
			for _, r := range readAll(t, c, topicRows, 4) {
				k := payload(r.Key)
				if k["entity_id"] != "E" || k["section"] != "FILT_MD" || k["call_id"] != nil || len(k) != 5 {
					t.Errorf("row key %s, want entity_id, event_time, section, sentence_index, label", r.Key)
				}
			}
		})
	}
}
