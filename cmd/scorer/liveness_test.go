package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/scorer/scorer/internal/broker"
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
	cluster, broker, err := broker.Start(broker.Options{Addr: "127.0.0.1:0", Partitions: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Close)
	metricsAddr := freeAddr(t)
	env := withEnv(testenv.ScorerEnv(t), "KAFKA_BROKERS", broker, "METRICS_ADDR", metricsAddr, "KAFKA_INPUT_PARTITIONS", "1",
		"WORKERS", "1", "CPU_THREADS", "1", "LIVENESS_STALL_TIMEOUT", limit.String(), "SCORE_CACHE_BYTES", "0")
	stop := runInProcess(t, env)
	waitReady(t, metricsAddr, 90*time.Second)

	// The transcript must take several times the limit whatever the model's
	// and the machine's speed: each attempt is twice the last, until one
	// takes twice the limit (by 2×, not 4×, the last attempt overshoots
	// that by less: on two cores 2 000 sentences took 4 s, and the 8 000
	// after them 15 s, where 4 000 would have done).
	sents := corpusSentences(t, 40, 160)

	// Poll /healthz every 100 ms from before the first record is produced
	// until the last result is out.
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
	w := &kafka.Writer{Addr: kafka.TCP(broker), Topic: "transcripts", RequiredAcks: kafka.RequireAll, BatchTimeout: time.Millisecond, BatchBytes: 16 << 20}
	defer w.Close()
	var took time.Duration
	n, attempts := 2000, 0
	for ; took < 2*limit && n <= 32000; n *= 2 {
		if len(sents) < n {
			t.Fatalf("corpus has %d distinct sentences, want %d", len(sents), n)
		}
		attempts++
		id := fmt.Sprintf("LONG-%d", attempts)
		ev, err := json.Marshal(map[string]any{"call_id": id, "sections": map[string][]string{"FILT_MD": sents[:n]}})
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		if err := w.WriteMessages(ctx, kafka.Message{Key: []byte(id), Value: ev}); err != nil {
			t.Fatal(err)
		}
		if out := readTopic(t, broker, "transcripts.scored", attempts, 5*time.Minute); len(out) != attempts {
			t.Fatalf("%d results, want %d", len(out), attempts)
		}
		took = time.Since(start)
		t.Logf("a %d-sentence transcript (%d pairs) took %v to publish", n, 3*n, took.Round(time.Millisecond))
	}
	time.Sleep(500 * time.Millisecond) // a last poll after the publish
	cancel()
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	t.Logf("/healthz polled %d times, %d not 200", polls, len(failed))
	if took < 2*limit {
		t.Errorf("the longest transcript took %v, under twice the %v limit: the test needs a longer one to mean anything", took, limit)
	}
	if len(failed) > 0 {
		t.Errorf("/healthz failed %d of %d polls while the transcripts were being scored; first: %q", len(failed), polls, failed[0])
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
}
