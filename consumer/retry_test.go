package consumer

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/segmentio/kafka-go"

	"github.com/scorer/scorer/schema"
)

// TestPublishRetriedNeverDropped: while the sink fails transiently nothing
// is committed; once it recovers every record is published and committed.
func TestPublishRetriedNeverDropped(t *testing.T) {
	t.Parallel()
	const topic, group = "retry", "g-retry"
	_, brokers := newCluster(t, topic, 1)
	produce(t, brokers, topic, []kafka.Message{eventMsg(0, "a"), eventMsg(0, "b"), eventMsg(0, "c")})
	var failing atomic.Bool
	failing.Store(true)
	var attempts atomic.Int32
	sk := &fakeSink{publishErr: func([]schema.ScoredTranscript) error {
		attempts.Add(1)
		if failing.Load() {
			return errors.New("leader not available")
		}
		return nil
	}}
	start(t, testConfig(brokers, topic, group), &fakeScorer{}, sk, testHooks{})
	eventually(t, 20*time.Second, "several publish attempts", func() bool { return attempts.Load() >= 5 })
	if c := committed(t, brokers, group, topic, 1)[0]; c > 0 {
		t.Fatalf("committed %d while every publish failed", c)
	}
	if len(sk.Dead()) != 0 {
		t.Fatal("transient failure dead-lettered")
	}
	failing.Store(false)
	eventually(t, 20*time.Second, "committed to end", func() bool { return committed(t, brokers, group, topic, 1)[0] == 3 })
	if got := countIDs(sk.Published()); got["a"] != 1 || got["b"] != 1 || got["c"] != 1 {
		t.Fatalf("published %v", got)
	}
}

// TestMetricsRegistered: the design's metric names are registered and
// move, and a second registration on the same registry is refused.
func TestMetricsRegistered(t *testing.T) {
	t.Parallel()
	const topic, group = "metrics", "g-metrics"
	_, brokers := newCluster(t, topic, 1)
	produce(t, brokers, topic, []kafka.Message{eventMsg(0, "a"), {Value: []byte("nope")}})
	reg := prometheus.NewRegistry()
	sk := &fakeSink{}
	c, err := New(testConfig(brokers, topic, group), &fakeScorer{}, sk, zerolog.Nop(), reg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := New(testConfig(brokers, topic, group), &fakeScorer{}, sk, zerolog.Nop(), reg); err == nil || !strings.HasPrefix(err.Error(), "consumer:") {
		t.Fatalf("duplicate registration: err = %v", err)
	}
	runCtx, stop := context.WithCancel(context.Background())
	r := &running{c: c, cancel: stop, errc: make(chan error, 1)}
	go func() { r.errc <- c.Run(runCtx) }()
	t.Cleanup(func() { r.stop(t) })
	eventually(t, 20*time.Second, "committed to end", func() bool { return committed(t, brokers, group, topic, 1)[0] == 2 })
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			switch {
			case m.Counter != nil:
				got[mf.GetName()] += m.Counter.GetValue()
			case m.Gauge != nil:
				got[mf.GetName()] += m.Gauge.GetValue()
			case m.Histogram != nil:
				got[mf.GetName()] += float64(m.Histogram.GetSampleCount())
			}
		}
	}
	want := map[string]float64{
		"scorer_messages_in_total": 2, "scorer_dlq_total": 1, "scorer_assigned_partitions": 1,
		"scorer_batch_messages": -1, "scorer_end_to_end_seconds": 1, "scorer_commit_seconds": -1,
		"scorer_consumer_lag": 0, "scorer_inflight_messages": 0,
		"scorer_commit_errors_total": 0, "scorer_committed_lag": 0, "scorer_oldest_unacked_seconds": 0, "scorer_tombstones_total": 0,
	}
	for name, v := range want {
		g, ok := got[name]
		if !ok || (v >= 0 && g != v) || (v < 0 && g == 0) {
			t.Errorf("%s = %v (present %v), want %v", name, g, ok, v)
		}
	}
}
