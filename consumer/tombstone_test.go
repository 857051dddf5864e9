package consumer

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/scorer/scorer/schema"
	"github.com/segmentio/kafka-go"
)

// TestTombstonesForwarded: a tombstone (key, null value) and a Debezium
// delete event become deletes of their call, in input order with the
// versions around them, and a tombstone without a key is dead-lettered. An
// empty value counts as a tombstone too, as it did when kafka-go fetched
// (its readNewBytes reads a zero-length value as nil).
func TestTombstonesForwarded(t *testing.T) {
	t.Parallel()
	const topic, group = "tomb", "g-tomb"
	_, brokers := newCluster(t, topic, 1)
	msgs := []kafka.Message{
		eventMsg(0, "A"),
		{Key: []byte("A")}, // tombstone
		{Key: []byte("B"), Value: []byte{}},
		{Value: []byte(`{"before":{"CALL_ID":"C","FILT_MD":"['x']"},"after":null,"op":"d"}`)},
		{}, // tombstone without a key
		{Value: []byte(`{"before":null,"after":{"call_id":"D","sections":{"S":["y"]}},"op":"c"}`)},
		eventMsg(0, "A"),
	}
	produce(t, brokers, topic, msgs)
	sk := &fakeSink{}
	cfg := testConfig(brokers, topic, group)
	cfg.BatchMaxWait = 300 * time.Millisecond
	start(t, cfg, &fakeScorer{}, sk, testHooks{})
	eventually(t, 20*time.Second, "committed to end", func() bool { return committed(t, brokers, group, topic, 1)[0] == int64(len(msgs)) })
	want := []string{"result:A", "delete:A", "delete:B", "delete:C", "result:D", "result:A"}
	if got := sk.Writes(); !slices.Equal(got, want) {
		t.Fatalf("writes %v, want %v", got, want)
	}
	reasons := map[int64]string{}
	for _, d := range sk.Dead() {
		reasons[d.Offset] = d.Reason
	}
	if reasons[4] != "missing_field" || len(reasons) != 1 {
		t.Fatalf("dead letters by offset %v, want only 4: missing_field (keyless tombstone)", reasons)
	}
}

// TestDeletePartlyRejected: the sink writes two tombstones of a run of
// three and rejects the middle one permanently, naming it. Only that one is
// dead-lettered; the two written are acknowledged as tombstones, not sent
// to the DLQ as if they had failed.
func TestDeletePartlyRejected(t *testing.T) {
	t.Parallel()
	const topic, group = "tomb-part", "g-tomb-part"
	_, brokers := newCluster(t, topic, 1)
	msgs := []kafka.Message{{Key: []byte("A")}, {Key: []byte("B")}, {Key: []byte("C")}}
	produce(t, brokers, topic, msgs)
	sk := &fakeSink{deleteErr: func(dels []schema.Delete) error {
		for i, d := range dels {
			if d.CallID == "B" {
				return &permanentSinkError{Indexes: []int{i}, Err: errors.New("record rejected")}
			}
		}
		return nil
	}}
	cfg := testConfig(brokers, topic, group)
	cfg.BatchMaxWait = 300 * time.Millisecond // one batch, one run of deletes
	r := start(t, cfg, &fakeScorer{}, sk, testHooks{})
	eventually(t, 20*time.Second, "committed to end", func() bool { return committed(t, brokers, group, topic, 1)[0] == 3 })
	if got, want := sk.Writes(), []string{"delete:A", "delete:C"}; !slices.Equal(got, want) {
		t.Errorf("writes %v, want %v", got, want)
	}
	var dead []string
	for _, d := range sk.Dead() {
		dead = append(dead, string(d.Key))
	}
	if !slices.Equal(dead, []string{"B"}) {
		t.Errorf("dead letters for %v, want only B", dead)
	}
	if s := r.c.Stats(); s.Published != 2 || s.DeadLettered != 1 {
		t.Errorf("published %d, dead-lettered %d; want 2 and 1", s.Published, s.DeadLettered)
	}
}
