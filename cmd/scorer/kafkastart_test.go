package main

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/scorer/scorer/internal/service"
	"github.com/scorer/scorer/internal/testenv"
)

// TestRunBootstrapsPastDeadBroker: a bootstrap list whose first broker is
// down (its port refuses connections) still starts: the scorer becomes
// ready and publishes a result, all through the broker after it.
func TestRunBootstrapsPastDeadBroker(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the service with the real model")
	}
	cluster, broker, err := service.StartBroker(service.BrokerOptions{Addr: "127.0.0.1:0", Partitions: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Close)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	_ = ln.Close()
	metricsAddr := freeAddr(t)
	env := withEnv(testenv.ScorerEnv(t), "KAFKA_BROKERS", dead+","+broker, "METRICS_ADDR", metricsAddr,
		"KAFKA_INPUT_PARTITIONS", "1", "LABELS", "consumer weakness")
	stop := runInProcess(t, env)
	waitReady(t, metricsAddr, 90*time.Second)

	ev := `{"call_id":"BOOT-1","sections":{"FILT_MD":["Consumers kept spending on travel."]}}`
	w := &kafka.Writer{Addr: kafka.TCP(broker), Topic: "transcripts", RequiredAcks: kafka.RequireAll, BatchTimeout: time.Millisecond}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	if err := w.WriteMessages(ctx, kafka.Message{Key: []byte("BOOT-1"), Value: []byte(ev)}); err != nil {
		t.Fatal(err)
	}
	_ = w.Close()
	msgs := readTopic(t, broker, "transcripts.scored", 1, 2*time.Minute)
	if len(msgs) != 1 {
		t.Fatalf("%d results, want 1", len(msgs))
	}
	var got struct {
		CallID string `json:"call_id"`
	}
	if err := json.Unmarshal(msgs[0].Value, &got); err != nil || got.CallID != "BOOT-1" {
		t.Errorf("result %s: %v", msgs[0].Value, err)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
}

// TestRunExitsOnUnfixableKafkaError: what the cluster will refuse on every
// attempt stops start-up at once with a non-zero exit naming the cause,
// instead of being retried as "not reachable yet" forever: a replication
// factor above the broker count, and, with KAFKA_CREATE_TOPICS=false, a
// topic that does not exist.
func TestRunExitsOnUnfixableKafkaError(t *testing.T) {
	for name, tc := range map[string]struct {
		env  []string
		want []string
	}{
		"replication factor 3 on one broker": {[]string{"KAFKA_TOPIC_REPLICATION_FACTOR", "3"}, []string{"Invalid Replication Factor", "transcripts"}},
		"missing topic, creation off":        {[]string{"KAFKA_CREATE_TOPICS", "false"}, []string{"transcripts.dlq", "missing", "KAFKA_CREATE_TOPICS"}},
	} {
		t.Run(name, func(t *testing.T) {
			_, broker, err := service.StartBroker(service.BrokerOptions{Addr: "127.0.0.1:0", Partitions: 1, Topics: []string{"transcripts", "transcripts.scored"}})
			if err != nil {
				t.Fatal(err)
			}
			env := withEnv(map[string]string{"KAFKA_BROKERS": broker, "METRICS_ADDR": "off", "LOG_FORMAT": "json",
				"MODEL_DIR": testenv.ModelDir(t, "nli-unigram-small"), "ORT_LIB": testenv.ORTLib(t)}, tc.env...)
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			logs := &lockedBuffer{}
			start := time.Now()
			err = run(ctx, []string{"run"}, func(k string) string { return env[k] }, strings.NewReader(""), io.Discard, logs)
			if ctx.Err() != nil {
				t.Fatalf("run still retrying after %v:\n%s", time.Since(start), testenv.Tail(logs.String(), 2000))
			}
			if err == nil || service.ExitCode(err) == 0 {
				t.Fatalf("run = %v, want a non-zero exit", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("run = %v, want it to name %q", err, w)
				}
			}
			if strings.Contains(logs.String(), "Kafka not reachable yet") {
				t.Errorf("an unfixable error was retried as unreachable:\n%s", testenv.Tail(logs.String(), 2000))
			}
		})
	}
}
