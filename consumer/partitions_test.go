package consumer

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/segmentio/kafka-go"
)

// TestNewPartitionsConsumed: partitions added to the input topic while the
// consumer runs are assigned and read without any membership change.
func TestNewPartitionsConsumed(t *testing.T) {
	t.Parallel()
	const topic, group = "grow", "g-grow"
	_, brokers := newCluster(t, topic, 1)
	produce(t, brokers, topic, []kafka.Message{eventMsg(0, "p0")})
	sk := &fakeSink{}
	cfg := testConfig(brokers, topic, group)
	cfg.PartitionWatchInterval = 200 * time.Millisecond
	r := start(t, cfg, &fakeScorer{}, sk, testHooks{})
	eventually(t, 20*time.Second, "p0 published", func() bool { return countIDs(sk.Published())["p0"] == 1 })

	cl := &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 5 * time.Second, Transport: testTransport(t)}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	resp, err := cl.CreatePartitions(ctx, &kafka.CreatePartitionsRequest{Topics: []kafka.TopicPartitionsConfig{{Name: topic, Count: 3}}})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range resp.Errors {
		if e != nil {
			t.Fatal(e)
		}
	}
	// A writer of its own: the default transport's metadata cache does not
	// know the new partitions yet.
	w := &kafka.Writer{Addr: kafka.TCP(brokers...), Topic: topic, RequiredAcks: kafka.RequireAll, Transport: testTransport(t),
		Balancer: kafka.BalancerFunc(func(m kafka.Message, _ ...int) int { return m.Partition })}
	defer w.Close()
	if err := w.WriteMessages(ctx, eventMsg(1, "p1"), eventMsg(2, "p2")); err != nil {
		t.Fatal(err)
	}
	eventually(t, 20*time.Second, "the new partitions' records published", func() bool {
		n := countIDs(sk.Published())
		return n["p1"] == 1 && n["p2"] == 1
	})
	if s := r.c.Stats(); s.Assigned != 3 {
		t.Errorf("assigned %d partitions, want 3", s.Assigned)
	}
}

// TestOffsetResetCounted: a committed offset past the log end (the topic
// was re-created) is reset to the log start, counted in
// scorer_offset_resets_total and logged, instead of kafka-go retrying it
// forever while the partition is silently not read.
func TestOffsetResetCounted(t *testing.T) {
	t.Parallel()
	const topic, group = "reset", "g-reset"
	_, brokers := newCluster(t, topic, 1)
	var msgs []kafka.Message
	for i := range 5 {
		msgs = append(msgs, eventMsg(0, fmt.Sprintf("r-%d", i)))
	}
	produce(t, brokers, topic, msgs)
	cl := &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 5 * time.Second, Transport: testTransport(t)}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if _, err := cl.OffsetCommit(ctx, &kafka.OffsetCommitRequest{GroupID: group, GenerationID: -1,
		Topics: map[string][]kafka.OffsetCommit{topic: {{Partition: 0, Offset: 100}}}}); err != nil {
		t.Fatal(err)
	}
	if got := committed(t, brokers, group, topic, 1)[0]; got != 100 {
		t.Fatalf("set-up: committed %d, want 100", got)
	}
	sk := &fakeSink{}
	c, reg := startMetered(t, testConfig(brokers, topic, group), &fakeScorer{}, sk)
	eventually(t, 20*time.Second, "every record read from the log start", func() bool { return len(countIDs(sk.Published())) == 5 })
	eventually(t, 10*time.Second, "committed to the log end", func() bool { return committed(t, brokers, group, topic, 1)[0] == 5 })
	if s := c.Stats(); s.OffsetResets != 1 {
		t.Errorf("offset resets %d, want 1", s.OffsetResets)
	}
	if v, ok := gaugeOf(t, reg, "scorer_offset_resets_total", 0); !ok || v != 1 {
		t.Errorf("scorer_offset_resets_total{partition=0} = %v (present %v), want 1", v, ok)
	}
}

// TestEndedPartitionSeriesStayDeleted: once a generation ended and deleted
// its partitions' series, a fetcher or a commit tick still running writes
// none back: the partition may be another member's, which reports it.
func TestEndedPartitionSeriesStayDeleted(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	cfg := testConfig([]string{"127.0.0.1:1"}, "t", "g")
	cfg.MaxUncommitted = 1
	c, err := New(cfg, &fakeScorer{}, &fakeSink{}, zerolog.Nop(), reg)
	if err != nil {
		t.Fatal(err)
	}
	ps := newPartState(0, 5)
	ps.logEnd.Store(10)
	if _, err := ps.wm.Track(5); err != nil { // one record in flight: the span is full
		t.Fatal(err)
	}
	g := &genState{parts: map[int]*partState{0: ps}}
	c.observePartitions(g)
	if _, ok := gaugeOf(t, reg, "scorer_committed_lag", 0); !ok {
		t.Fatal("set-up: no scorer_committed_lag series for an owned partition")
	}
	c.endPartitions(g)
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	c.waitSpan(ctx, ps) // a paused fetcher told to stop
	c.observePartitions(g)
	for _, name := range []string{"scorer_committed_lag", "scorer_oldest_unacked_seconds", "scorer_partition_paused", "scorer_consumer_lag"} {
		if v, ok := gaugeOf(t, reg, name, 0); ok {
			t.Errorf("%s{partition=0} = %v after its generation ended", name, v)
		}
	}
}
