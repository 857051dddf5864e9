package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/scorer/scorer/internal/broker"
	"github.com/scorer/scorer/internal/cli"
	"github.com/scorer/scorer/internal/testenv"
	"github.com/scorer/scorer/producer"
)

// TestRunBootstrapsPastDeadBroker: a bootstrap list whose first broker is
// down (its port refuses connections) still starts: the scorer becomes
// ready and publishes a result, all through the broker after it. What it
// scores is beside the point, so it runs the drills' small model, not the
// production architecture, whose load alone is seconds of CPU under -race.
func TestRunBootstrapsPastDeadBroker(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the service with a real model")
	}
	cluster, broker, err := broker.Start(broker.Options{Addr: "127.0.0.1:0", Partitions: 1})
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
	env := withEnv(testenv.ScorerEnv(t), "MODEL_DIR", testenv.ModelDir(t, "nli-unigram-small"), "KAFKA_BROKERS", dead+","+broker,
		"METRICS_ADDR", metricsAddr, "KAFKA_INPUT_PARTITIONS", "1", "LABELS", "consumer weakness")
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
			_, broker, err := broker.Start(broker.Options{Addr: "127.0.0.1:0", Partitions: 1, Topics: []string{"transcripts", "transcripts.scored"}})
			if err != nil {
				t.Fatal(err)
			}
			env := withEnv(map[string]string{"KAFKA_BROKERS": broker, "METRICS_ADDR": "off", "LOG_FORMAT": "json",
				"MODEL_DIR": testenv.ModelDir(t, "nli-unigram-small"), "ORT_LIB": testenv.ORTLib(t)}, tc.env...)
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			logs := &testenv.LockedBuffer{}
			start := time.Now()
			err = run(ctx, []string{"run"}, func(k string) string { return env[k] }, strings.NewReader(""), io.Discard, logs)
			if ctx.Err() != nil {
				t.Fatalf("run still retrying after %v:\n%s", time.Since(start), testenv.Tail(logs.String(), 2000))
			}
			if err == nil || cli.ExitCode(err) == 0 {
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

// TestLargeOutputsArePublished: with the default limits the scorer creates
// its topics sized for what it accepts, so a transcript whose result is
// over 1 MiB is published, not dead-lettered as output_too_large as under
// the old fixed 1 MiB; and a 2 MiB record that is not an event keeps its
// value in the DLQ. The result is large by its matches, not by its
// sentence count: at THRESHOLD 0 each of 8,000 sentences is matched under
// all three labels, so the result carries its text three times (it was
// 60,000 unmatched sentences: about as many bytes for 7.5 times the tokenizing
// and cache look-ups under the race detector, the package's slowest test).
// The size comes from the text, whatever the model, so it runs the drills'
// small model rather than the production architecture, whose load alone is
// seconds of CPU under -race.
func TestLargeOutputsArePublished(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the service with a real model")
	}
	// A broker that takes large records on any topic: what limits the
	// result is the scorer's own output limit.
	cluster, broker, err := broker.Start(broker.Options{Addr: "127.0.0.1:0", Partitions: 1, MaxMessageBytes: 64 << 20})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Close)
	metricsAddr := freeAddr(t)
	env := withEnv(testenv.ScorerEnv(t), "MODEL_DIR", testenv.ModelDir(t, "nli-unigram-small"), "KAFKA_BROKERS", broker,
		"METRICS_ADDR", metricsAddr, "KAFKA_INPUT_PARTITIONS", "1", "THRESHOLD", "0")
	stop := runInProcess(t, env)
	waitReady(t, metricsAddr, 90*time.Second)

	// Real sentences, repeated: the score cache keeps inference to the
	// distinct ones, while the result holds a score, a flag and a match
	// (the sentence) for each of the 8,000 under each label.
	sents := corpusSentences(t, 40, 160)[:300]
	const n = 8_000
	md := make([]string, n)
	for i := range md {
		md[i] = sents[i%len(sents)]
	}
	big, err := json.Marshal(map[string]any{"call_id": "BIG-8K", "sections": map[string][]string{"FILT_MD": md}})
	if err != nil {
		t.Fatal(err)
	}
	bad := []byte(`{"call_id": "BAD-2MIB", "sections": {"FILT_MD": ["` + strings.Repeat("x", 2<<20) + `"]`)
	w := &kafka.Writer{Addr: kafka.TCP(broker), Topic: "transcripts", RequiredAcks: kafka.RequireAll, BatchTimeout: time.Millisecond,
		BatchBytes: 32 << 20, BatchSize: 1}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	for _, m := range []kafka.Message{{Key: []byte("BIG-8K"), Value: big}, {Key: []byte("BAD-2MIB"), Value: bad}} {
		if err := w.WriteMessages(ctx, m); err != nil {
			t.Fatalf("produce %s (%d bytes): %v", m.Key, len(m.Value), err)
		}
	}
	_ = w.Close()

	dlq := readTopic(t, broker, "transcripts.dlq", 1, 3*time.Minute)
	if len(dlq) != 1 || string(dlq[0].Key) != "BAD-2MIB" {
		t.Fatalf("DLQ holds %d records, want the 2 MiB one only (the large result must not be there)", len(dlq))
	}
	if !bytes.Equal(dlq[0].Value, bad) {
		t.Errorf("the 2 MiB dead letter's value is %d bytes, want its %d original bytes", len(dlq[0].Value), len(bad))
	}
	out := readTopic(t, broker, "transcripts.scored", 1, 3*time.Minute)
	if len(out) != 1 {
		t.Fatalf("%d results, want 1", len(out))
	}
	st := decodeScored(t, out)[0]
	sec := st.Sections["FILT_MD"]
	if st.CallID != "BIG-8K" || sec.Sentences != n || len(st.Labels) != 3 {
		t.Fatalf("result %s: %d sentences, labels %v; want BIG-8K, %d, three labels", st.CallID, sec.Sentences, st.Labels, n)
	}
	for _, l := range st.Labels {
		if r := sec.Results[l]; len(r.Scores) != n || len(r.Matches) != n {
			t.Errorf("label %q: %d scores and %d matches, want %d of each", l, len(r.Scores), len(r.Matches), n)
		}
	}
	t.Logf("%d-sentence result: %d bytes (over the old 1 MiB limit: %v)", n, len(out[0].Value), len(out[0].Value) > 1<<20)
	if len(out[0].Value) <= 1<<20 {
		t.Errorf("the result is %d bytes: the test needs one over the old 1 MiB limit", len(out[0].Value))
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
}

// TestRunRefusesTooSmallOutputTopic: an existing output topic whose
// max.message.bytes cannot hold the largest result the input limits allow
// stops start-up, naming the topic, both sizes and both remedies (with the
// MAX_MESSAGE_BYTES that would fit), instead of dead-lettering the largest
// transcripts later.
func TestRunRefusesTooSmallOutputTopic(t *testing.T) {
	cluster, broker, err := broker.Start(broker.Options{Addr: "127.0.0.1:0", Partitions: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Close)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	const topicMax = 4 << 20
	if err := producer.EnsureTopics(ctx, []string{broker}, nil, producer.TopicSpec{Name: "transcripts.scored",
		Configs: map[string]string{"max.message.bytes": strconv.Itoa(topicMax)}}); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"KAFKA_BROKERS": broker, "METRICS_ADDR": "off", "LOG_FORMAT": "json", "MAX_SENTENCES": "20000",
		"MODEL_DIR": testenv.ModelDir(t, "nli-unigram-small"), "ORT_LIB": testenv.ORTLib(t)}
	logs := &testenv.LockedBuffer{}
	err = run(ctx, []string{"run"}, func(k string) string { return env[k] }, strings.NewReader(""), io.Discard, logs)
	if ctx.Err() != nil {
		t.Fatalf("run started on an output topic too small for its limits:\n%s", testenv.Tail(logs.String(), 2000))
	}
	if err == nil || cli.ExitCode(err) == 0 {
		t.Fatalf("run = %v, want a non-zero exit", err)
	}
	for _, w := range []string{"KAFKA_OUTPUT_TOPIC transcripts.scored", "max.message.bytes " + strconv.Itoa(topicMax), "MAX_MESSAGE_BYTES=8388608",
		"MAX_SENTENCES=20000", "--add-config max.message.bytes=", "lower MAX_MESSAGE_BYTES (at most "} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("run = %v\nwant it to contain %q", err, w)
		}
	}
}
