package consumer

import (
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/scorer/scorer/schema"
)

// TestDeadLetterPermanentResendsOnlyFailed: the DLQ rejects one dead letter
// of a batch permanently (naming it) a few times. Only that one is sent
// again — its neighbours, already acknowledged, are never duplicated — and
// once it is written the partition commits to the end.
func TestDeadLetterPermanentResendsOnlyFailed(t *testing.T) {
	t.Parallel()
	const topic, group = "dlqperm", "g-dlqperm"
	_, brokers := newCluster(t, topic, 1)
	msgs := []kafka.Message{
		{Key: []byte("k0"), Value: []byte(`{bad`)},
		{Key: []byte("k1"), Value: []byte(`{bad`)},
		{Key: []byte("k2"), Value: []byte(`{bad`)},
		eventMsg(0, "good-3"),
	}
	produce(t, brokers, topic, msgs)
	var rejections, k1Writes atomic.Int32
	sk := &fakeSink{deadErr: func(dls []schema.DeadLetter) error {
		for i, d := range dls {
			if string(d.Key) != "k1" {
				continue
			}
			k1Writes.Add(1)
			if rejections.Load() < 3 {
				rejections.Add(1)
				return &permanentSinkError{Indexes: []int{i}, Err: errors.New("record rejected")}
			}
		}
		return nil
	}}
	cfg := testConfig(brokers, topic, group)
	cfg.BatchMaxWait = 300 * time.Millisecond // one batch for all four
	r := start(t, cfg, &fakeScorer{}, sk, testHooks{})
	eventually(t, 20*time.Second, "committed to end", func() bool { return committed(t, brokers, group, topic, 1)[0] == 4 })
	perOffset := map[int64]int{}
	for _, d := range sk.Dead() {
		perOffset[d.Offset]++
	}
	for off := range int64(3) {
		if perOffset[off] != 1 {
			t.Errorf("offset %d dead-lettered %d times, want 1 (all: %v)", off, perOffset[off], perOffset)
		}
	}
	if n := k1Writes.Load(); n != 4 {
		t.Errorf("k1 sent %d times, want 4 (3 rejections + 1)", n)
	}
	if got := countIDs(sk.Published()); got["good-3"] != 1 {
		t.Errorf("published %v", got)
	}
	if s := r.c.Stats(); s.DeadLettered != 3 {
		t.Errorf("DeadLettered = %d, want 3", s.DeadLettered)
	}
}
