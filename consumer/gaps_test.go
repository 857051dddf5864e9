package consumer

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// commitOffset sets the group's committed offset of partition 0, as a
// consumer that ran earlier would have left it.
func commitOffset(t *testing.T, brokers []string, group, topic string, offset int64) {
	t.Helper()
	cl := &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 5 * time.Second, Transport: testTransport(t)}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if _, err := cl.OffsetCommit(ctx, &kafka.OffsetCommitRequest{GroupID: group, GenerationID: -1,
		Topics: map[string][]kafka.OffsetCommit{topic: {{Partition: 0, Offset: offset}}}}); err != nil {
		t.Fatal(err)
	}
}

// TestCompactionGapConsumed: the README's input topic is compacted by
// call_id. While the group was away one call was revised 1,500 times;
// compaction left one revision, so the next offset past the committed 10
// is 1,509, more than MaxUncommitted (1,000) away. The consumer reads on
// through the gap, publishes every record after it and commits to the end.
func TestCompactionGapConsumed(t *testing.T) {
	t.Parallel()
	const topic, group = "compacted", "g-compacted"
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Close)
	if err := cluster.CreateTopic(topic, 1, map[string]string{"cleanup.policy": "compact"}); err != nil {
		t.Fatal(err)
	}
	brokers := cluster.ListenAddrs()
	var msgs []kafka.Message
	for i := range 10 {
		msgs = append(msgs, eventMsg(0, fmt.Sprintf("before-%d", i)))
	}
	for range 1500 {
		msgs = append(msgs, eventMsg(0, "revised"))
	}
	produce(t, brokers, topic, msgs)
	msgs = nil
	for i := range 20 {
		msgs = append(msgs, eventMsg(0, fmt.Sprintf("after-%d", i)))
	}
	produce(t, brokers, topic, msgs)
	cluster.Compact()
	commitOffset(t, brokers, group, topic, 10)

	// Set-up check: the gap is there.
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: {0: kgo.NewOffset().At(10)}}))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	first := cl.PollRecords(ctx, 1).Records()
	cancel()
	cl.Close()
	if len(first) != 1 || first[0].Offset-10 < DefaultMaxUncommitted {
		t.Fatalf("set-up: compaction left no gap of %d past offset 10: first records %v", DefaultMaxUncommitted, first)
	}

	sk := &fakeSink{}
	cfg := testConfig(brokers, topic, group)
	cfg.MaxUncommitted = DefaultMaxUncommitted
	r := start(t, cfg, &fakeScorer{}, sk, testHooks{})
	eventually(t, 20*time.Second, "every record past the gap published", func() bool {
		n := countIDs(sk.Published())
		return n["revised"] == 1 && n["after-19"] == 1
	})
	eventually(t, 10*time.Second, "committed to the log end", func() bool { return committed(t, brokers, group, topic, 1)[0] == 1530 })
	for id, n := range countIDs(sk.Published()) {
		if strings.HasPrefix(id, "before-") || n != 1 {
			t.Errorf("%s published %d times", id, n)
		}
	}
	if s := r.c.Stats(); s.Pauses != 0 {
		t.Errorf("fetching paused %d times with at most 21 records in flight", s.Pauses)
	}
}

// txnProducer is a transactional (exactly-once) producer writing to the
// partitions its records name.
func txnProducer(t *testing.T, brokers []string, id string) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.TransactionalID(id), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return cl
}

// produceTxn writes the records to partition 0 of topic in one transaction
// of a transactional (exactly-once) producer and commits or aborts it.
func produceTxn(t *testing.T, cl *kgo.Client, topic string, callIDs []string, commit bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := cl.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	for _, id := range callIDs {
		m := eventMsg(0, id)
		cl.Produce(ctx, &kgo.Record{Topic: topic, Partition: 0, Key: m.Key, Value: m.Value}, func(_ *kgo.Record, err error) {
			if err != nil {
				t.Errorf("produce %s: %v", id, err)
			}
		})
	}
	if err := cl.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if err := cl.EndTransaction(ctx, kgo.TransactionEndTry(commit)); err != nil {
		t.Fatal(err)
	}
}

func callIDs(prefix string, n int) []string {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("%s-%d", prefix, i)
	}
	return ids
}

// TestAbortedTransactionNotScored: the input topic is written by an
// exactly-once producer: a committed transaction, an aborted one of 2,500
// records (more than MaxUncommitted), a committed one. The consumer reads
// committed data: not one aborted record is scored, and it goes on through
// the gap the aborted transaction leaves, committing past it.
func TestAbortedTransactionNotScored(t *testing.T) {
	t.Parallel()
	const topic, group = "txn", "g-txn"
	_, brokers := newCluster(t, topic, 1)
	cl := txnProducer(t, brokers, "txn-producer")
	produceTxn(t, cl, topic, callIDs("before", 10), true)
	produceTxn(t, cl, topic, callIDs("aborted", 2500), false)
	produceTxn(t, cl, topic, callIDs("after", 20), true)

	sc, sk := &fakeScorer{}, &fakeSink{}
	cfg := testConfig(brokers, topic, group)
	cfg.MaxUncommitted = DefaultMaxUncommitted
	start(t, cfg, sc, sk, testHooks{})
	eventually(t, 30*time.Second, "every committed record published", func() bool {
		n := countIDs(sk.Published())
		return n["before-9"] == 1 && n["after-19"] == 1
	})
	// 10 + 1 marker + 2,500 + 1 marker + 20 records: the last committed
	// record is offset 2,531; its transaction's marker follows it.
	eventually(t, 10*time.Second, "committed past the aborted transaction", func() bool {
		return committed(t, brokers, group, topic, 1)[0] >= 2532
	})
	for _, call := range sc.Calls() {
		for _, id := range call {
			if strings.HasPrefix(id, "aborted-") {
				t.Fatalf("scored %s, a record of an aborted transaction", id)
			}
		}
	}
	if n := countIDs(sk.Published()); len(n) != 30 {
		t.Errorf("published %d distinct calls, want 30", len(n))
	}
}

// TestReadUncommittedSetting: KAFKA_ISOLATION_LEVEL=read_uncommitted reads
// what an aborted transaction wrote, as Kafka's own consumers do.
func TestReadUncommittedSetting(t *testing.T) {
	t.Parallel()
	const topic, group = "txn-uncommitted", "g-txn-uncommitted"
	_, brokers := newCluster(t, topic, 1)
	cl := txnProducer(t, brokers, "txn-uncommitted")
	produceTxn(t, cl, topic, callIDs("aborted", 5), false)
	produceTxn(t, cl, topic, callIDs("committed", 5), true)
	sk := &fakeSink{}
	cfg := testConfig(brokers, topic, group)
	cfg.ReadUncommitted = true
	start(t, cfg, &fakeScorer{}, sk, testHooks{})
	eventually(t, 20*time.Second, "aborted and committed records published", func() bool { return len(countIDs(sk.Published())) == 10 })
}

// TestRetentionPassesReadPosition: mid-generation, retention deletes records
// the consumer has not read yet (its next fetch is held until then). The
// consumer reads on from the new log start, counts and logs the reset, and
// commits to the end: the deleted records are lost to retention, not a
// reason to stall.
func TestRetentionPassesReadPosition(t *testing.T) {
	t.Parallel()
	const topic, group = "retention", "g-retention"
	cluster, brokers := newCluster(t, topic, 1)
	produce(t, brokers, topic, msgsFor(0, callIDs("early", 5)))
	var hold atomic.Bool
	release := make(chan struct{})
	cluster.ControlKey(kmsg.Fetch.Int16(), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		cluster.KeepControl()
		for _, rt := range kreq.(*kmsg.FetchRequest).Topics {
			for _, rp := range rt.Partitions {
				if hold.Load() && rp.FetchOffset == 5 {
					cluster.SleepControl(func() { <-release })
				}
			}
		}
		return nil, nil, false
	})
	hold.Store(true)
	sk := &fakeSink{}
	c, reg := startMetered(t, testConfig(brokers, topic, group), &fakeScorer{}, sk)
	eventually(t, 20*time.Second, "the early records committed", func() bool { return committed(t, brokers, group, topic, 1)[0] == 5 })

	produce(t, brokers, topic, append(msgsFor(0, callIDs("deleted", 5)), msgsFor(0, callIDs("kept", 5))...))
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	req := kmsg.NewPtrDeleteRecordsRequest()
	rt := kmsg.NewDeleteRecordsRequestTopic()
	rt.Topic = topic
	rp := kmsg.NewDeleteRecordsRequestTopicPartition()
	rp.Partition, rp.Offset = 0, 10
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
	hold.Store(false)
	close(release)

	eventually(t, 20*time.Second, "committed to the log end", func() bool { return committed(t, brokers, group, topic, 1)[0] == 15 })
	n := countIDs(sk.Published())
	for _, id := range callIDs("deleted", 5) {
		if n[id] != 0 {
			t.Errorf("%s published, though retention deleted it before it was read", id)
		}
	}
	if n["kept-4"] != 1 || n["early-4"] != 1 {
		t.Errorf("published %v", n)
	}
	if s := c.Stats(); s.OffsetResets != 1 {
		t.Errorf("offset resets %d, want 1", s.OffsetResets)
	}
	if v, ok := gaugeOf(t, reg, "scorer_offset_resets_total", 0); !ok || v != 1 {
		t.Errorf("scorer_offset_resets_total{partition=0} = %v (present %v), want 1", v, ok)
	}
}

// msgsFor is an event record on partition p for each call id.
func msgsFor(p int, ids []string) []kafka.Message {
	msgs := make([]kafka.Message, len(ids))
	for i, id := range ids {
		msgs[i] = eventMsg(p, id)
	}
	return msgs
}

// spreadMsgs is one event per id, the i-th to partition i mod parts.
func spreadMsgs(parts int, ids []string) []kafka.Message {
	msgs := make([]kafka.Message, len(ids))
	for i, id := range ids {
		msgs[i] = eventMsg(i%parts, id)
	}
	return msgs
}
