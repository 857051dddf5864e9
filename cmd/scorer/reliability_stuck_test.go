package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/scorer/scorer/internal/broker"
	"github.com/scorer/scorer/internal/kafkatest"
	"github.com/scorer/scorer/internal/testenv"
)

// TestReliabilityStuckDeadLetter runs the service with a dead letter that
// cannot be written (the broker refuses every write to the DLQ topic, as
// an unauthorized topic would). Its partition pauses at MAX_UNCOMMITTED
// with nothing after the stuck record published or committed, while the
// other partition keeps publishing; /metrics shows the pause, the committed
// lag and the age of the stuck record, and /healthz fails once its dead
// letter has been retried for LIVENESS_STALL_TIMEOUT, although work
// progresses elsewhere. When
// the DLQ accepts writes again, everything drains and /healthz recovers.
func TestReliabilityStuckDeadLetter(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the service with a real model")
	}
	_, events := testenv.ShortestTranscripts(t, 12)
	cluster, broker, err := broker.Start(broker.Options{Addr: "127.0.0.1:0", Partitions: 2})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Close)
	var refuse atomic.Bool
	refuse.Store(true)
	cluster.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
		cluster.KeepControl()
		r := req.(*kmsg.ProduceRequest)
		if !refuse.Load() || len(r.Topics) == 0 || r.Topics[0].Topic != "transcripts.dlq" {
			return nil, nil, false
		}
		return kafkatest.ProduceError(r, kerr.TopicAuthorizationFailed.Code), nil, true
	})
	metricsAddr := freeAddr(t)
	// What is asserted is where records wait, what is committed and what
	// the metrics and probes say, not scores: the drills' model
	// (nli-unigram-small, relEnv) does it in a fraction of the production
	// architecture's CPU (its load alone is seconds under -race).
	env := testenv.ScorerEnv(t)
	env["MODEL_DIR"] = testenv.ModelDir(t, "nli-unigram-small")
	env["KAFKA_BROKERS"] = broker
	env["KAFKA_INPUT_PARTITIONS"] = "2"
	env["METRICS_ADDR"] = metricsAddr
	env["BATCH_MAX_MESSAGES"] = "1"
	env["MAX_INFLIGHT_BATCHES"] = "4"
	env["MAX_UNCOMMITTED"] = "3"
	env["LIVENESS_STALL_TIMEOUT"] = "4s"
	stop := runInProcess(t, env)
	waitReady(t, metricsAddr, 60*time.Second)

	msgs := []kafka.Message{{Partition: 0, Key: []byte("stuck"), Value: []byte(`{"call_id": "stuck", "sections": {`)}}
	for i, ev := range events {
		b, err := json.Marshal(ev)
		if err != nil {
			t.Fatal(err)
		}
		msgs = append(msgs, kafka.Message{Partition: i % 2, Key: []byte(ev.CallID), Value: b})
	}
	w := &kafka.Writer{Addr: kafka.TCP(broker), Topic: "transcripts", RequiredAcks: kafka.RequireAll, BatchTimeout: time.Millisecond,
		Balancer: kafka.BalancerFunc(func(m kafka.Message, _ ...int) int { return m.Partition })}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	if err := w.WriteMessages(ctx, msgs...); err != nil {
		t.Fatal(err)
	}
	_ = w.Close()

	const p0, p1 = `{partition="0",topic="transcripts"}`, `{partition="1",topic="transcripts"}`
	deadline := time.Now().Add(2 * time.Minute)
	var m map[string]float64
	for {
		m = testenv.Scrape(t, metricsAddr)
		// Gauges move at each commit tick (1 s): wait for partition 1's
		// commit to catch up too.
		if m["scorer_partition_paused"+p0] == 1 && testenv.MetricValue(m, `scorer_messages_out_total{kind="result",topic="transcripts.scored"}`) >= 6 &&
			m["scorer_committed_lag"+p1] == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("partition 0 not paused with partition 1's 6 results out: paused %v, results %v", m["scorer_partition_paused"+p0],
				testenv.MetricValue(m, `scorer_messages_out_total{kind="result",topic="transcripts.scored"}`))
		}
		time.Sleep(200 * time.Millisecond)
	}
	if got := testenv.MetricValue(m, `scorer_messages_out_total{kind="result",topic="transcripts.scored"}`); got != 6 {
		t.Errorf("%v results published; want partition 1's 6 only (partition 0 waits behind its stuck record)", got)
	}
	if lag := m["scorer_committed_lag"+p0]; lag != 7 {
		t.Errorf("scorer_committed_lag partition 0 = %v, want 7 (nothing committed)", lag)
	}
	if m["scorer_partition_paused"+p1] != 0 || m["scorer_committed_lag"+p1] != 0 {
		t.Errorf("partition 1: paused %v, committed lag %v; want 0 and 0", m["scorer_partition_paused"+p1], m["scorer_committed_lag"+p1])
	}
	healthz := func() (int, string) {
		resp, err := http.Get("http://" + metricsAddr + "/healthz")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	for {
		code, body := healthz()
		if code == http.StatusServiceUnavailable {
			if !strings.Contains(body, "a record's publish or dead letter") {
				t.Errorf("/healthz body %q does not name the stuck record", body)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/healthz still %d: %s", code, body)
		}
		time.Sleep(200 * time.Millisecond)
	}
	// The gauge is refreshed at each commit tick, so it may trail /healthz
	// (computed at the probe) by up to a second.
	if age := testenv.Scrape(t, metricsAddr)["scorer_oldest_unacked_seconds"+p0]; age < 3 {
		t.Errorf("scorer_oldest_unacked_seconds partition 0 = %v, want about 4 once /healthz failed", age)
	}

	refuse.Store(false)
	waitCommittedToEnd(t, broker, "scorer", "transcripts", time.Minute)
	for code, body := healthz(); code != http.StatusOK; code, body = healthz() {
		if time.Now().After(deadline) {
			t.Fatalf("/healthz still %d after the DLQ recovered: %s", code, body)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
}
