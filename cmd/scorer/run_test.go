package main

import (
	"context"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/scorer/scorer/internal/cli"
	"github.com/scorer/scorer/internal/testenv"
)

// TestRunStopWhileWaitingForKafka: SIGTERM (ctx cancelled) while start-up
// still waits for an unreachable broker is a clean stop: run returns nil
// (exit 0) and says it stopped before start-up finished.
func TestRunStopWhileWaitingForKafka(t *testing.T) {
	env := map[string]string{"KAFKA_BROKERS": freeAddr(t), "METRICS_ADDR": "off", "LOG_FORMAT": "json"}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	logs := &testenv.LockedBuffer{}
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

// TestRunRefusesEmptyBrokers: without KAFKA_BROKERS (or with only commas)
// `scorer run` starts nothing and fails at once naming the variable and the
// explicit in-memory choice: a missing secret must not become a scorer that
// reports ready on a broker of its own and consumes nothing real.
func TestRunRefusesEmptyBrokers(t *testing.T) {
	for name, brokers := range map[string]string{"unset": "", "commas": ",", "spaces": " , "} {
		t.Run(name, func(t *testing.T) {
			env := map[string]string{"METRICS_ADDR": "off", "LOG_FORMAT": "json"}
			if brokers != "" {
				env["KAFKA_BROKERS"] = brokers
			}
			start := time.Now()
			// Bounded: a run that starts anyway would serve until stopped.
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			defer cancel()
			var stderr testenv.LockedBuffer
			err := run(ctx, []string{"run", "--broker-addr", "127.0.0.1:0"}, func(k string) string { return env[k] }, strings.NewReader(""), io.Discard, &stderr)
			if err == nil {
				t.Fatal("run accepted an empty KAFKA_BROKERS")
			}
			if cli.ExitCode(err) == 0 || !strings.Contains(err.Error(), "KAFKA_BROKERS") || !strings.Contains(err.Error(), "embedded") {
				t.Errorf("run = %v (exit %d), want a non-zero exit naming KAFKA_BROKERS and KAFKA_BROKERS=embedded", err, cli.ExitCode(err))
			}
			if d := time.Since(start); d > 5*time.Second {
				t.Errorf("refusing took %v; it needs no broker, model or ONNX Runtime", d)
			}
			if strings.Contains(stderr.String(), "in-memory") {
				t.Errorf("an in-memory broker was started:\n%s", testenv.Tail(stderr.String(), 2000))
			}
		})
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	err := run(ctx, []string{"run"}, func(k string) string {
		return map[string]string{"KAFKA_BROKERS": "embedded,127.0.0.1:9092", "METRICS_ADDR": "off"}[k]
	}, strings.NewReader(""), io.Discard, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "KAFKA_BROKERS") {
		t.Errorf("run with embedded among addresses = %v, want an error naming KAFKA_BROKERS", err)
	}
}
