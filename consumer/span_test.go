package consumer

import (
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"

	"github.com/scorer/scorer/schema"
)

// gaugeOf returns the value of the gauge or counter name with the given
// partition label (-1: the unlabelled one), and whether it exists.
func gaugeOf(t *testing.T, reg *prometheus.Registry, name string, partition int) (float64, bool) {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			match := partition < 0
			for _, l := range m.GetLabel() {
				if l.GetName() == "partition" && l.GetValue() == fmt.Sprint(partition) {
					match = true
				}
			}
			if !match {
				continue
			}
			if m.Gauge != nil {
				return m.Gauge.GetValue(), true
			}
			return m.Counter.GetValue(), true
		}
	}
	return 0, false
}

// TestStuckDeadLetterPausesItsPartition: a dead letter that can never be
// written (the DLQ refuses it, as an unauthorized topic would) holds its
// partition. Records behind it are scored but not published (offset
// order), fetching of the partition pauses once MaxUncommitted records past
// the committed offset were fetched, the metrics say so, the oldest
// unacknowledged age grows although the other partition keeps publishing,
// and nothing past the stuck record is committed. Once the DLQ accepts it,
// the partition drains and commits to its end.
func TestStuckDeadLetterPausesItsPartition(t *testing.T) {
	t.Parallel()
	const topic, group, limit = "stuck", "g-stuck", 5
	_, brokers := newCluster(t, topic, 2)
	msgs := []kafka.Message{{Partition: 0, Key: []byte("bad"), Value: []byte(`{bad`)}}
	for i := range 20 {
		msgs = append(msgs, eventMsg(0, fmt.Sprintf("p0-%d", i)), eventMsg(1, fmt.Sprintf("p1-%d", i)))
	}
	produce(t, brokers, topic, msgs)
	var refuse atomic.Bool
	refuse.Store(true)
	sk := &fakeSink{deadErr: func([]schema.DeadLetter) error {
		if refuse.Load() {
			return errors.New("TOPIC_AUTHORIZATION_FAILED")
		}
		return nil
	}}
	cfg := testConfig(brokers, topic, group)
	cfg.BatchMaxMessages, cfg.MaxInflightBatches, cfg.MaxUncommitted = 1, 4, limit
	c, reg := startMetered(t, cfg, &fakeScorer{}, sk)

	eventually(t, 20*time.Second, "partition 1 committed to its end", func() bool { return committed(t, brokers, group, topic, 2)[1] == 20 })
	eventually(t, 10*time.Second, "partition 0 paused", func() bool {
		v, _ := gaugeOf(t, reg, "scorer_partition_paused", 0)
		return v == 1
	})
	time.Sleep(10 * cfg.CommitInterval) // give a wrong fetch, publish or commit every chance
	for _, p := range sk.Published() {
		if p.Source.Partition == 0 {
			t.Fatalf("%s published from partition 0 while its offset 0 is not acknowledged", p.CallID)
		}
	}
	if got := committed(t, brokers, group, topic, 2)[0]; got >= 1 {
		t.Fatalf("partition 0 committed %d past the stuck offset 0", got)
	}
	// Fetched on partition 0: at most the limit, plus the one record the
	// paused fetcher holds; partition 1 fetched its 20.
	if s := c.Stats(); s.MessagesIn > 20+limit+1 || s.Pauses == 0 {
		t.Fatalf("fetched %d records (limit: 20 + %d + 1), pauses %d", s.MessagesIn, limit, s.Pauses)
	}
	if v, ok := gaugeOf(t, reg, "scorer_oldest_unacked_seconds", 0); !ok || v < 0.5 {
		t.Errorf("scorer_oldest_unacked_seconds{partition=0} = %v (present %v), want ≥ 0.5", v, ok)
	}
	if v, _ := gaugeOf(t, reg, "scorer_oldest_unacked_seconds", 1); v != 0 {
		t.Errorf("scorer_oldest_unacked_seconds{partition=1} = %v, want 0", v)
	}
	if v, ok := gaugeOf(t, reg, "scorer_committed_lag", 0); !ok || v != 21 {
		t.Errorf("scorer_committed_lag{partition=0} = %v (present %v), want 21 (nothing committed)", v, ok)
	}
	if v, ok := gaugeOf(t, reg, "scorer_committed_lag", 1); !ok || v != 0 {
		t.Errorf("scorer_committed_lag{partition=1} = %v (present %v), want 0", v, ok)
	}
	if age := c.OldestUnacked(); age < 10*cfg.CommitInterval {
		t.Errorf("OldestUnacked = %v, want ≥ %v", age, 10*cfg.CommitInterval)
	}
	// The stuck record's dead letter has been retried all along: liveness
	// reads this.
	if age := c.OldestAcknowledgement(); age < 10*cfg.CommitInterval {
		t.Errorf("OldestAcknowledgement = %v, want ≥ %v", age, 10*cfg.CommitInterval)
	}

	refuse.Store(false)
	eventually(t, 20*time.Second, "partition 0 committed to its end", func() bool { return committed(t, brokers, group, topic, 2)[0] == 21 })
	eventually(t, 5*time.Second, "partition 0 resumed", func() bool {
		v, _ := gaugeOf(t, reg, "scorer_partition_paused", 0)
		return v == 0
	})
	if n := countIDs(sk.Published()); len(n) != 40 {
		t.Errorf("published %d distinct calls, want 40", len(n))
	}
	if age := c.OldestAcknowledgement(); age != 0 {
		t.Errorf("OldestAcknowledgement = %v with everything acknowledged, want 0", age)
	}
}

// TestLongScoringIsNotAStuckAcknowledgement: a record whose scoring takes
// long ages (OldestUnacked) but is not acknowledging yet, so
// OldestAcknowledgement, what liveness reads for a stuck record, stays 0;
// records behind it on its partition, scored and waiting for their turn,
// do not count either.
func TestLongScoringIsNotAStuckAcknowledgement(t *testing.T) {
	t.Parallel()
	const topic, group = "long", "g-long"
	_, brokers := newCluster(t, topic, 1)
	produce(t, brokers, topic, []kafka.Message{eventMsg(0, "long"), eventMsg(0, "after-1"), eventMsg(0, "after-2")})
	release := make(chan struct{})
	sc := blockOn("long", release)
	sk := &fakeSink{}
	cfg := testConfig(brokers, topic, group)
	cfg.BatchMaxMessages, cfg.MaxInflightBatches = 1, 3
	c := start(t, cfg, sc, sk, testHooks{}).c

	eventually(t, 20*time.Second, "the records behind the long one scored", func() bool { return len(sc.Calls()) == 3 })
	time.Sleep(time.Second)
	if age := c.OldestUnacked(); age < time.Second {
		t.Errorf("OldestUnacked = %v while the first record scores, want ≥ 1s", age)
	}
	if age := c.OldestAcknowledgement(); age != 0 {
		t.Errorf("OldestAcknowledgement = %v while nothing is being written, want 0", age)
	}
	close(release)
	eventually(t, 20*time.Second, "all three published", func() bool { return len(countIDs(sk.Published())) == 3 })
}
