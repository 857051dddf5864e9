package main

import (
	"context"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/scorer/scorer/internal/testenv"
)

// TestRunStopWhileWaitingForKafka: SIGTERM (ctx cancelled) while start-up
// still waits for an unreachable broker is a clean stop: run returns nil
// (exit 0) and says it stopped before start-up finished.
func TestRunStopWhileWaitingForKafka(t *testing.T) {
	env := map[string]string{"KAFKA_BROKERS": freeAddr(t), "METRICS_ADDR": "off", "LOG_FORMAT": "json"}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	logs := &lockedBuffer{}
	errc := make(chan error, 1)
	go func() {
		errc <- run(ctx, []string{"run"}, func(k string) string { return env[k] }, strings.NewReader(""), io.Discard, logs)
	}()
	waitUntil(t, 30*time.Second, "a start-up retry", func() bool {
		return strings.Contains(logs.String(), "Kafka not reachable yet; retrying")
	}, nil)
	cancel()
	select {
	case err := <-errc:
		if err != nil {
			t.Fatalf("run = %v, want nil (exit 0) for a stop during start-up", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("run did not return within 10s of the stop")
	}
	if !strings.Contains(logs.String(), "stopped before start-up finished") {
		t.Errorf("no stop line in the log:\n%s", testenv.Tail(logs.String(), 2000))
	}
}
