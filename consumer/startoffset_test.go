package consumer

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// TestNewGroupStartsAtEarliest: a group with no committed offset reads the
// partition from its log start (KAFKA_START_OFFSET=earliest, the default):
// every record written before it joined is scored once.
func TestNewGroupStartsAtEarliest(t *testing.T) {
	t.Parallel()
	const topic, group = "start-earliest", "g-start-earliest"
	_, brokers := newCluster(t, topic, 1)
	produce(t, brokers, topic, msgsFor(0, callIDs("old", 5)))
	cfg := testConfig(brokers, topic, group)
	cfg.StartOffset = kafka.FirstOffset
	sk := &fakeSink{}
	c, _ := startMetered(t, cfg, &fakeScorer{}, sk)
	eventually(t, 20*time.Second, "committed to the log end", func() bool { return committed(t, brokers, group, topic, 1)[0] == 5 })
	n := countIDs(sk.Published())
	for _, id := range callIDs("old", 5) {
		if n[id] != 1 {
			t.Errorf("%s published %d times, want 1: %v", id, n[id], n)
		}
	}
	if s := c.Stats(); s.OffsetResets != 0 {
		t.Errorf("offset resets %d, want 0: a new group's start is not a reset", s.OffsetResets)
	}
}

// TestNewGroupStartsAtLatest: with KAFKA_START_OFFSET=latest a group with
// no committed offset starts at the log end: nothing written before it
// joined is scored, everything written after it is. When "after" begins
// is the consumer's to decide (its first look at the log end), so records
// are written until one is scored; the partition is read in order, so
// once one is, every earlier record was either scored already or never
// will be.
func TestNewGroupStartsAtLatest(t *testing.T) {
	t.Parallel()
	const topic, group = "start-latest", "g-start-latest"
	_, brokers := newCluster(t, topic, 1)
	produce(t, brokers, topic, msgsFor(0, callIDs("old", 5)))
	cfg := testConfig(brokers, topic, group)
	cfg.StartOffset = kafka.LastOffset
	sk := &fakeSink{}
	c, _ := startMetered(t, cfg, &fakeScorer{}, sk)
	end := 5 + writeUntilScored(t, brokers, topic, sk)
	produce(t, brokers, topic, msgsFor(0, []string{"last"}))
	end++
	eventually(t, 20*time.Second, "committed to the log end", func() bool { return committed(t, brokers, group, topic, 1)[0] == int64(end) })
	n := countIDs(sk.Published())
	for _, id := range callIDs("old", 5) {
		if n[id] != 0 {
			t.Errorf("%s published, though it was written before the group started at the log end", id)
		}
	}
	if n["last"] != 1 {
		t.Errorf("the record written after the start published %d times, want 1: %v", n["last"], n)
	}
	if s := c.Stats(); s.OffsetResets != 0 {
		t.Errorf("offset resets %d, want 0: a new group's start is not a reset", s.OffsetResets)
	}
}

// writeUntilScored writes "new-i" records to partition 0 of topic, one
// every 100 ms, until one of them is published; it returns how many it
// wrote.
func writeUntilScored(t *testing.T, brokers []string, topic string, sk *fakeSink) int {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for i := 0; ; i++ {
		produce(t, brokers, topic, msgsFor(0, []string{fmt.Sprintf("new-%d", i)}))
		for range 5 {
			for _, st := range sk.Published() {
				if strings.HasPrefix(st.CallID, "new-") {
					return i + 1
				}
			}
			time.Sleep(20 * time.Millisecond)
		}
		if time.Now().After(deadline) {
			t.Fatalf("none of %d records written after the consumer started was published", i+1)
		}
	}
}

// TestCommittedOffsetOutOfRange: a committed offset outside the partition's
// log is reset, counted and logged. Past the log end (the topic re-created,
// the log truncated) it resets as a new group starts, per
// KAFKA_START_OFFSET, as Kafka's auto.offset.reset does. Before the log
// start (retention deleted records the group had not read) it resets to
// the log start with either setting, where Kafka's latest would go to the
// end: the records still kept were never scored, and skipping them too
// would lose more than retention did (franz-go resumes at the log start
// too when retention passes a position it is reading).
func TestCommittedOffsetOutOfRange(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		start     int64
		commit    int64 // the committed offset; the log is [5, 10] when below
		deleteTo  int64 // records before this are deleted (0: none)
		scored    []string
		notScored []string
		latest    bool // records written after the start are scored, the log's are not
	}{
		"past the end, earliest": {start: kafka.FirstOffset, commit: 100, scored: callIDs("old", 10)},
		"past the end, latest":   {start: kafka.LastOffset, commit: 100, notScored: callIDs("old", 10), latest: true},
		"before the start, earliest": {start: kafka.FirstOffset, commit: 2, deleteTo: 5,
			scored: callIDs("old", 10)[5:], notScored: callIDs("old", 10)[:5]},
		"before the start, latest": {start: kafka.LastOffset, commit: 2, deleteTo: 5,
			scored: callIDs("old", 10)[5:], notScored: callIDs("old", 10)[:5]},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			const topic, group = "out-of-range", "g-out-of-range"
			_, brokers := newCluster(t, topic, 1)
			produce(t, brokers, topic, msgsFor(0, callIDs("old", 10)))
			if tc.deleteTo > 0 {
				deleteRecords(t, brokers, topic, tc.deleteTo)
			}
			cl := &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 5 * time.Second, Transport: testTransport(t)}
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			defer cancel()
			if _, err := cl.OffsetCommit(ctx, &kafka.OffsetCommitRequest{GroupID: group, GenerationID: -1,
				Topics: map[string][]kafka.OffsetCommit{topic: {{Partition: 0, Offset: tc.commit}}}}); err != nil {
				t.Fatal(err)
			}
			cfg := testConfig(brokers, topic, group)
			cfg.StartOffset = tc.start
			sk := &fakeSink{}
			c, reg := startMetered(t, cfg, &fakeScorer{}, sk)
			end := int64(10)
			if tc.latest {
				end += int64(writeUntilScored(t, brokers, topic, sk))
			}
			eventually(t, 20*time.Second, "committed to the log end", func() bool { return committed(t, brokers, group, topic, 1)[0] == end })
			n := countIDs(sk.Published())
			for _, id := range tc.scored {
				if n[id] != 1 {
					t.Errorf("%s published %d times, want 1: %v", id, n[id], n)
				}
			}
			for _, id := range tc.notScored {
				if n[id] != 0 {
					t.Errorf("%s published, want it skipped: %v", id, n)
				}
			}
			if s := c.Stats(); s.OffsetResets != 1 {
				t.Errorf("offset resets %d, want 1", s.OffsetResets)
			}
			if v, ok := gaugeOf(t, reg, "scorer_offset_resets_total", 0); !ok || v != 1 {
				t.Errorf("scorer_offset_resets_total{partition=0} = %v (present %v), want 1", v, ok)
			}
		})
	}
}

// deleteRecords deletes partition 0 of topic's records before offset, as
// retention would.
func deleteRecords(t *testing.T, brokers []string, topic string, offset int64) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	req := kmsg.NewPtrDeleteRecordsRequest()
	rt := kmsg.NewDeleteRecordsRequestTopic()
	rt.Topic = topic
	rp := kmsg.NewDeleteRecordsRequestTopicPartition()
	rp.Partition, rp.Offset = 0, offset
	rt.Partitions = append(rt.Partitions, rp)
	req.Topics = append(req.Topics, rt)
	req.TimeoutMillis = 5000
	resp, err := req.RequestWith(t.Context(), cl)
	if err != nil {
		t.Fatal(err)
	}
	if err := kerr.ErrorForCode(resp.Topics[0].Partitions[0].ErrorCode); err != nil {
		t.Fatalf("set-up: delete records: %v", err)
	}
}
