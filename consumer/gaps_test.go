package consumer

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

// commitOffset sets the group's committed offset of partition 0, as a
// consumer that ran earlier would have left it.
func commitOffset(t *testing.T, brokers []string, group, topic string, offset int64) {
	t.Helper()
	cl := &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 5 * time.Second}
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
