package consumer

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/scorer/scorer/schema"
)

// TestStuckDeadLetterSparesOtherPartitions: with the default batches (16
// records, 2 in flight), batches mix both partitions. The batch wait is
// long enough that every batch but the last fills: with 11 records of
// partition 0 and 30 of partition 1, a full batch of 16 then holds both
// whatever order the fetches bring them in (with the default 200ms, a
// loaded machine cut batches of one partition only). A dead letter of
// partition 0 that can never be written holds partition 0 only: every
// record of partition 1, including those that shared a batch with the
// stuck one, is published and committed, while nothing of partition 0 past
// the stuck record is.
func TestStuckDeadLetterSparesOtherPartitions(t *testing.T) {
	t.Parallel()
	const topic, group = "stuck-mixed", "g-stuck-mixed"
	_, brokers := newCluster(t, topic, 2)
	msgs := []kafka.Message{{Partition: 0, Key: []byte("bad"), Value: []byte(`{bad`)}}
	for i := range 30 {
		msgs = append(msgs, eventMsg(1, fmt.Sprintf("p1-%d", i)))
		if i < 10 {
			msgs = append(msgs, eventMsg(0, fmt.Sprintf("p0-%d", i)))
		}
	}
	produce(t, brokers, topic, msgs)
	sk := &fakeSink{deadErr: func([]schema.DeadLetter) error { return errors.New("UNKNOWN_TOPIC_OR_PARTITION") }}
	cfg := testConfig(brokers, topic, group)
	cfg.BatchMaxMessages, cfg.MaxInflightBatches, cfg.BatchMaxWait = DefaultBatchMaxMessages, DefaultMaxInflightBatches, 3*time.Second
	sc := &fakeScorer{}
	start(t, cfg, sc, sk, testHooks{})

	eventually(t, 20*time.Second, "partition 1 committed to its end", func() bool { return committed(t, brokers, group, topic, 2)[1] == 30 })
	mixed := false
	for _, call := range sc.Calls() {
		p0, p1 := 0, 0
		for _, id := range call {
			if id[:2] == "p0" {
				p0++
			} else {
				p1++
			}
		}
		mixed = mixed || p0 > 0 && p1 > 0
	}
	if !mixed {
		t.Error("no batch held both partitions: the test did not test mixed batches")
	}
	if n := countIDs(sk.Published()); len(n) != 30 {
		t.Errorf("published %d distinct calls, want partition 1's 30", len(n))
	}
	for _, p := range sk.Published() {
		if p.Source.Partition == 0 {
			t.Errorf("%s published from partition 0 while its offset 0 is not acknowledged", p.CallID)
		}
	}
	if got := committed(t, brokers, group, topic, 2)[0]; got >= 1 {
		t.Errorf("partition 0 committed %d past the stuck offset 0", got)
	}
}

// TestSlowPartitionPausesByBatches: partition 0's results cannot be written
// for now (its Publish blocks) while scoring goes on. Its scored batches
// wait for their turn, but no more than twice MaxInflightBatches of them:
// then its fetching pauses, far below MaxUncommitted records, so the
// results held in memory stay bounded, while partition 1 publishes all.
func TestSlowPartitionPausesByBatches(t *testing.T) {
	t.Parallel()
	const topic, group = "slowpart", "g-slowpart"
	_, brokers := newCluster(t, topic, 2)
	produce(t, brokers, topic, append(msgsFor(0, callIDs("p0", 40)), msgsFor(1, callIDs("p1", 40))...))
	release := make(chan struct{})
	var once sync.Once
	t.Cleanup(func() { once.Do(func() { close(release) }) })
	sk := &fakeSink{publishErr: func(res []schema.ScoredTranscript) error {
		if res[0].Source.Partition == 0 {
			<-release
		}
		return nil
	}}
	cfg := testConfig(brokers, topic, group)
	cfg.BatchMaxMessages, cfg.MaxInflightBatches = 1, 2
	c, reg := startMetered(t, cfg, &fakeScorer{}, sk)
	eventually(t, 20*time.Second, "partition 1 committed to its end", func() bool { return committed(t, brokers, group, topic, 2)[1] == 40 })
	eventually(t, 10*time.Second, "partition 0 paused", func() bool {
		v, _ := gaugeOf(t, reg, "scorer_partition_paused", 0)
		return v == 1
	})
	// The bound is the waiting batches plus one record: the fetcher checks
	// the batch count when it takes the next record, which can be before the
	// batch loop has cut the batch holding the record it handed over last.
	g := c.cur.Load()
	if n, limit := g.parts[0].wm.Pending(), 2*cfg.MaxInflightBatches*cfg.BatchMaxMessages+1; n > limit {
		t.Errorf("partition 0 has %d records in flight, want at most %d (its batches waiting and one handed over)", n, limit)
	}
	once.Do(func() { close(release) })
	eventually(t, 20*time.Second, "partition 0 committed to its end", func() bool { return committed(t, brokers, group, topic, 2)[0] == 40 })
}
