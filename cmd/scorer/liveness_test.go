package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/scorer/scorer/internal/service"
	"github.com/scorer/scorer/internal/testenv"
)

// TestLivenessLongTranscript: with LIVENESS_STALL_TIMEOUT=3s and one
// worker, a transcript whose scoring takes several times that is published
// without a single 503 from /healthz, polled throughout: its inference
// batches keep finishing, so the record is working, not stuck. (Before,
// the record's age since its fetch failed the probe after 3 s and the
// orchestrator would have restarted a pod that was working.)
// TestReliabilityStuckDeadLetter is the other side: a stuck record fails
// the probe.
func TestLivenessLongTranscript(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the service with the real model")
	}
	const limit = 3 * time.Second
	cluster, broker, err := service.StartBroker(service.BrokerOptions{Addr: "127.0.0.1:0", Partitions: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Close)
	metricsAddr := freeAddr(t)
	env := withEnv(testenv.ScorerEnv(t), "KAFKA_BROKERS", broker, "METRICS_ADDR", metricsAddr, "KAFKA_INPUT_PARTITIONS", "1",
		"WORKERS", "1", "CPU_THREADS", "1", "LIVENESS_STALL_TIMEOUT", limit.String(), "SCORE_CACHE_BYTES", "0")
	stop := runInProcess(t, env)
	waitReady(t, metricsAddr, 90*time.Second)

	sents := corpusSentences(t, 40, 160)
	if len(sents) < 2000 {
		t.Fatalf("corpus has %d distinct sentences, want 2000", len(sents))
	}
	ev, err := json.Marshal(map[string]any{"call_id": "LONG-1", "sections": map[string][]string{"FILT_MD": sents[:2000]}})
	if err != nil {
		t.Fatal(err)
	}

	// Poll /healthz every 100 ms from before the record is produced until
	// its result is out.
	var (
		mu     sync.Mutex
		polls  int
		failed []string
	)
	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	wg.Go(func() {
		for ctx.Err() == nil {
			resp, err := http.Get("http://" + metricsAddr + "/healthz")
			if err == nil {
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				mu.Lock()
				polls++
				if resp.StatusCode != http.StatusOK {
					failed = append(failed, strings.TrimSpace(string(body)))
				}
				mu.Unlock()
			}
			time.Sleep(100 * time.Millisecond)
		}
	})
	start := time.Now()
	w := &kafka.Writer{Addr: kafka.TCP(broker), Topic: "transcripts", RequiredAcks: kafka.RequireAll, BatchTimeout: time.Millisecond, BatchBytes: 8 << 20}
	if err := w.WriteMessages(ctx, kafka.Message{Key: []byte("LONG-1"), Value: ev}); err != nil {
		t.Fatal(err)
	}
	_ = w.Close()
	out := readTopic(t, broker, "transcripts.scored", 1, 5*time.Minute)
	took := time.Since(start)
	time.Sleep(500 * time.Millisecond) // a last poll after the publish
	cancel()
	wg.Wait()
	if len(out) != 1 {
		t.Fatalf("%d results, want 1", len(out))
	}
	mu.Lock()
	defer mu.Unlock()
	t.Logf("a 2000-sentence transcript (6,000 pairs) took %v to publish; /healthz polled %d times, %d not 200", took.Round(time.Millisecond), polls, len(failed))
	if took < 2*limit {
		t.Errorf("the transcript took %v, under twice the %v limit: the test needs a longer one to mean anything", took, limit)
	}
	if len(failed) > 0 {
		t.Errorf("/healthz failed %d of %d polls while the transcript was being scored; first: %q", len(failed), polls, failed[0])
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
}
