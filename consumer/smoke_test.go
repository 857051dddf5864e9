package consumer

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"
)

// newCluster starts an in-process Kafka-protocol broker with one topic and
// closes it when the test ends.
func newCluster(t *testing.T, topic string, partitions int32) (*kfake.Cluster, []string) {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(partitions, topic))
	if err != nil {
		t.Fatalf("kfake: %v", err)
	}
	t.Cleanup(c.Close)
	return c, c.ListenAddrs()
}

// testTransport is a kafka-go transport of the test's own, closed when the
// test ends. A Client or Writer without one uses kafka.DefaultTransport,
// which keeps a connection pool, and its goroutines and buffers, per broker
// address for the life of the process; every test's kfake cluster listens on
// new addresses, so a run of this package left about a hundred goroutines
// behind and a -count run of it grew with every round.
func testTransport(t testing.TB) *kafka.Transport {
	tr := &kafka.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	return tr
}

// produce writes n records to topic, round-robin over partitions, with
// values from mk, and waits for the broker's ack.
func produce(t *testing.T, brokers []string, topic string, msgs []kafka.Message) {
	t.Helper()
	w := &kafka.Writer{
		Addr:         kafka.TCP(brokers...),
		Topic:        topic,
		RequiredAcks: kafka.RequireAll,
		BatchTimeout: 5 * time.Millisecond,
		Balancer:     kafka.BalancerFunc(func(m kafka.Message, _ ...int) int { return m.Partition }),
		Transport:    testTransport(t),
	}
	defer w.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 15*time.Second)
	defer cancel()
	if err := w.WriteMessages(ctx, msgs...); err != nil {
		t.Fatalf("produce: %v", err)
	}
}

// committed reads the group's committed offsets for topic's partitions.
func committed(t *testing.T, brokers []string, group, topic string, partitions int) map[int]int64 {
	t.Helper()
	cl := &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 5 * time.Second, Transport: testTransport(t)}
	ps := make([]int, partitions)
	for i := range ps {
		ps[i] = i
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	resp, err := cl.OffsetFetch(ctx, &kafka.OffsetFetchRequest{GroupID: group, Topics: map[string][]int{topic: ps}})
	if err != nil {
		t.Fatalf("offset fetch: %v", err)
	}
	out := map[int]int64{}
	for _, p := range resp.Topics[topic] {
		if p.Error != nil {
			t.Fatalf("offset fetch partition %d: %v", p.Partition, p.Error)
		}
		out[p.Partition] = p.CommittedOffset
	}
	return out
}

// TestSmokeConsumerGroupOnKfake checks that kafka-go's ConsumerGroup,
// a partition Reader and Generation.CommitOffsets work against kfake at all:
// everything else in this package's tests builds on it.
func TestSmokeConsumerGroupOnKfake(t *testing.T) {
	t.Parallel()
	const topic = "smoke"
	_, brokers := newCluster(t, topic, 1)
	var msgs []kafka.Message
	for i := range 3 {
		msgs = append(msgs, kafka.Message{Value: fmt.Appendf(nil, "v%d", i)})
	}
	produce(t, brokers, topic, msgs)

	cg, err := kafka.NewConsumerGroup(kafka.ConsumerGroupConfig{
		ID: "smoke-group", Brokers: brokers, Topics: []string{topic},
		SessionTimeout: 6 * time.Second, RebalanceTimeout: 6 * time.Second,
		HeartbeatInterval: 500 * time.Millisecond, JoinGroupBackoff: 200 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer cg.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	gen, err := cg.Next(ctx)
	if err != nil {
		t.Fatalf("next: %v", err)
	}
	as := gen.Assignments[topic]
	if len(as) != 1 || as[0].ID != 0 {
		t.Fatalf("assignments = %+v", as)
	}
	r := kafka.NewReader(kafka.ReaderConfig{Brokers: brokers, Topic: topic, Partition: 0, MaxWait: 100 * time.Millisecond})
	defer r.Close()
	if err := r.SetOffset(as[0].Offset); err != nil {
		t.Fatal(err)
	}
	var last kafka.Message
	for i := range 3 {
		m, err := r.FetchMessage(ctx)
		if err != nil {
			t.Fatalf("fetch %d: %v", i, err)
		}
		if string(m.Value) != fmt.Sprintf("v%d", i) {
			t.Fatalf("fetch %d = %q", i, m.Value)
		}
		last = m
	}
	if last.HighWaterMark != 3 {
		t.Fatalf("high water mark = %d, want 3", last.HighWaterMark)
	}
	if err := gen.CommitOffsets(map[string]map[int]int64{topic: {0: last.Offset + 1}}); err != nil {
		t.Fatalf("commit: %v", err)
	}
	if got := committed(t, brokers, "smoke-group", topic, 1); got[0] != 3 {
		t.Fatalf("committed = %v, want 3", got)
	}
}
