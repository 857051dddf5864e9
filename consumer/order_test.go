package consumer

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/scorer/scorer/schema"
)

// TestVersionsPublishedInInputOrder reproduces the vendor pattern of issue
// 13: six calls, each a long version 1 followed by a short version 2 on one
// partition, one record per batch and two batches in flight. Version 2
// finishes scoring first every time, yet for every call the last record
// published is version 2 (the highest input offset), and the partition's
// results are published in input-offset order.
func TestVersionsPublishedInInputOrder(t *testing.T) {
	t.Parallel()
	const topic, group = "versions", "g-versions"
	_, brokers := newCluster(t, topic, 1)
	var msgs []kafka.Message
	for i := range 6 {
		id := fmt.Sprintf("call-%d", i)
		for _, v := range []string{"1", "2"} {
			msgs = append(msgs, kafka.Message{Key: []byte(id),
				Value: fmt.Appendf(nil, `{"call_id":%q,"version_id":%q,"sections":{"FILT_MD":["Demand was strong."]}}`, id, v)})
		}
	}
	produce(t, brokers, topic, msgs)
	var scoring, overlap atomic.Int32
	sc := &fakeScorer{hook: func(ctx context.Context, evs []schema.TranscriptEvent) error {
		if scoring.Add(1) > 1 {
			overlap.Add(1)
		}
		defer scoring.Add(-1)
		if evs[0].VersionID == "1" { // the long version scores slowly
			select {
			case <-time.After(150 * time.Millisecond):
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return nil
	}}
	sk := &fakeSink{}
	cfg := testConfig(brokers, topic, group)
	cfg.BatchMaxMessages, cfg.MaxInflightBatches = 1, 2
	start(t, cfg, sc, sk, testHooks{})
	eventually(t, 20*time.Second, "all published", func() bool { return len(sk.Published()) == len(msgs) })

	// Inference did overlap: batches were scored side by side.
	if overlap.Load() == 0 {
		t.Error("no two batches were ever scored at the same time")
	}
	last := map[string]int64{}
	prev := int64(-1)
	for _, r := range sk.Published() {
		if r.Source.Offset <= prev {
			t.Errorf("offset %d published after %d", r.Source.Offset, prev)
		}
		prev = r.Source.Offset
		last[r.CallID] = r.Source.Offset
		if r.Source.Generation < 1 {
			t.Errorf("offset %d: source generation %d, want the group generation (≥ 1)", r.Source.Offset, r.Source.Generation)
		}
	}
	for i := range 6 {
		id := fmt.Sprintf("call-%d", i)
		if want := int64(2*i + 1); last[id] != want {
			t.Errorf("%s: last record published is from offset %d, want %d (version 2)", id, last[id], want)
		}
	}
}
