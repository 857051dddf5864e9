package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"testing"
	"time"

	"github.com/scorer/scorer/internal/broker"
	"github.com/scorer/scorer/internal/produce"
	"github.com/scorer/scorer/internal/testenv"
	"github.com/scorer/scorer/schema"
)

// kcatRecord is one line of `kcat -C -J`.
type kcatRecord struct {
	Topic     string   `json:"topic"`
	Partition int      `json:"partition"`
	Offset    int64    `json:"offset"`
	Key       *string  `json:"key"`
	Payload   *string  `json:"payload"`
	Headers   []string `json:"headers"`
}

func (r kcatRecord) header(k string) (string, bool) {
	for i := 0; i+1 < len(r.Headers); i += 2 {
		if r.Headers[i] == k {
			return r.Headers[i+1], true
		}
	}
	return "", false
}

func kcatPath(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("kcat")
	if err != nil {
		t.Fatal("kcat not found on PATH: `make test` installs it (apt-get install kcat)")
	}
	return p
}

// kcatConsume reads count records from topic with kcat's JSON envelope.
func kcatConsume(t *testing.T, broker, topic string, count int) []kcatRecord {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, kcatPath(t), "-C", "-b", broker, "-t", topic, "-o", "beginning", "-c", fmt.Sprint(count), "-J", "-q")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("kcat -C %s: %v (got %d bytes)", topic, err, len(out))
	}
	var recs []kcatRecord
	for _, line := range bytes.Split(bytes.TrimSpace(out), []byte("\n")) {
		var r kcatRecord
		if err := json.Unmarshal(line, &r); err != nil {
			t.Fatalf("kcat output %q: %v", line, err)
		}
		recs = append(recs, r)
	}
	if len(recs) != count {
		t.Fatalf("kcat read %d records from %s, want %d", len(recs), topic, count)
	}
	return recs
}

// TestKcatInterop has an independent Kafka client (kcat) feed the service
// good and bad records and read back Connect-format results, flat rows and
// dead letters with their headers. The formats are the point, not the
// scores (a row is written per sentence and label, matched or not), so it
// runs the drills' small model rather than the production architecture,
// whose load alone is seconds of CPU under -race.
func TestKcatInterop(t *testing.T) {
	if testing.Short() {
		t.Skip("scores real transcripts")
	}
	kcat := kcatPath(t)
	_, events := testenv.ShortestTranscripts(t, 3)
	cluster, broker, err := broker.Start(broker.Options{Addr: "127.0.0.1:0", Partitions: 2})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Close)
	env := testenv.ScorerEnv(t)
	env["MODEL_DIR"] = testenv.ModelDir(t, "nli-unigram-small")
	env["KAFKA_BROKERS"] = broker
	env["KAFKA_INPUT_PARTITIONS"] = "2"
	env["OUTPUT_FORMAT"] = "connect"
	env["OUTPUT_ROWS_TOPIC"] = "transcripts.rows"
	metricsAddr := freeAddr(t)
	env["METRICS_ADDR"] = metricsAddr
	stop := runInProcess(t, env)
	// kcat -C fails at once on a topic that does not exist yet: wait until
	// the scorer has created its topics and is ready.
	waitReady(t, metricsAddr, 90*time.Second)

	// kcat -K splits key and value on a delimiter; records are written one per line.
	var in bytes.Buffer
	goodKeys := map[string]bool{}
	bad := map[string]string{ // key → expected scorer.dlq.reason
		"bad-json":   "malformed_json",
		"no-call-id": "missing_field",
		"wrong-type": "wrong_type",
		"no-text":    "no_sentences",
	}
	badValues := map[string]string{
		"bad-json":   `{"call_id": "X-1", "sections": {`,
		"no-call-id": `{"sections": {"FILT_MD": ["A sentence."]}}`,
		"wrong-type": `{"call_id": "X-3", "sections": {"FILT_MD": [1, 2]}}`,
		"no-text":    `{"call_id": "X-4", "sections": {"FILT_MD": []}}`,
	}
	order := []string{"bad-json", "", "no-call-id", "", "wrong-type", "", "no-text"}
	next := 0
	for _, k := range order {
		if k == "" {
			ev := events[next]
			next++
			b, _ := json.Marshal(ev)
			goodKeys[ev.CallID] = true
			fmt.Fprintf(&in, "%s\t%s\n", ev.CallID, b)
			continue
		}
		fmt.Fprintf(&in, "%s\t%s\n", k, badValues[k])
	}
	prod := exec.Command(kcat, "-P", "-b", broker, "-t", "transcripts", "-K", "\t", "-H", "origin=kcat")
	prod.Stdin = &in
	if out, err := prod.CombinedOutput(); err != nil {
		t.Fatalf("kcat -P: %v\n%s", err, out)
	}

	// Results: Connect envelopes valid for JsonConverter, keyed by call_id, with headers.
	rows := 0
	for _, r := range kcatConsume(t, broker, "transcripts.scored", len(goodKeys)) {
		if r.Key == nil || !goodKeys[*r.Key] {
			t.Errorf("result key %v is not one of the good inputs", r.Key)
			continue
		}
		if sha, ok := r.header(schema.HeaderModelSHA256); !ok || len(sha) != 64 {
			t.Errorf("%s: model sha header %q", *r.Key, sha)
		}
		if _, ok := r.header(schema.HeaderContentSHA256); !ok {
			t.Errorf("%s: no content hash header", *r.Key)
		}
		if err := schema.ValidateEnvelope([]byte(*r.Payload)); err != nil {
			t.Errorf("%s: %v", *r.Key, err)
		}
		var st schema.ScoredTranscript
		if err := produce.DecodeOutput([]byte(*r.Payload), &st); err != nil || st.CallID != *r.Key {
			t.Errorf("%s: payload call_id %q err %v", *r.Key, st.CallID, err)
		}
		for _, sec := range st.Sections {
			rows += sec.Sentences * len(st.Labels)
		}
	}

	// Flat rows: one per (call_id, section, sentence_index, label), keyed by those four.
	for _, r := range kcatConsume(t, broker, "transcripts.rows", rows) {
		if err := schema.ValidateEnvelope([]byte(*r.Key)); err != nil {
			t.Fatalf("row key: %v", err)
		}
		if err := schema.ValidateEnvelope([]byte(*r.Payload)); err != nil {
			t.Fatalf("row value: %v", err)
		}
		var key struct{ Payload schema.RowKey }
		var val struct{ Payload schema.ScoreRow }
		_ = json.Unmarshal([]byte(*r.Key), &key)
		_ = json.Unmarshal([]byte(*r.Payload), &val)
		if key.Payload != val.Payload.Key() || !goodKeys[key.Payload.CallID] || val.Payload.Sentence == "" {
			t.Fatalf("row key %+v vs value %+v", key.Payload, val.Payload)
		}
	}

	// Dead letters: original key, value and headers kept, Connect error headers added.
	for _, r := range kcatConsume(t, broker, "transcripts.dlq", len(bad)) {
		if r.Key == nil {
			t.Fatal("dead letter without its original key")
		}
		want, ok := bad[*r.Key]
		if !ok {
			t.Errorf("dead letter for %q, a good record", *r.Key)
			continue
		}
		if reason, _ := r.header(schema.HeaderDLQReason); reason != want {
			t.Errorf("%s: reason %q, want %q", *r.Key, reason, want)
		}
		if r.Payload == nil || *r.Payload != badValues[*r.Key] {
			t.Errorf("%s: value not kept: %v", *r.Key, r.Payload)
		}
		if v, _ := r.header("origin"); v != "kcat" {
			t.Errorf("%s: original header lost: %v", *r.Key, r.Headers)
		}
		for _, h := range []string{"__connect.errors.topic", "__connect.errors.partition", "__connect.errors.offset",
			"__connect.errors.stage", "__connect.errors.exception.class.name", "__connect.errors.exception.message"} {
			if v, ok := r.header(h); !ok || v == "" {
				t.Errorf("%s: header %s missing", *r.Key, h)
			}
		}
		if topic, _ := r.header("__connect.errors.topic"); topic != "transcripts" {
			t.Errorf("%s: errors.topic %q", *r.Key, topic)
		}
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
}

// TestKcatVersionsAndTombstones runs the service as a new user would, with
// one record per batch and two batches in flight, and has kcat publish
// three calls each as a long version 1 followed by a short version 2, then
// one more call followed by its tombstone (kcat -Z: an empty value is sent
// as NULL). Read back with kcat, per key the last output record is the one
// from the highest input offset: version 2 for the versioned calls (though
// it scored faster than version 1), a NULL-valued tombstone for the
// deleted call.
func TestKcatVersionsAndTombstones(t *testing.T) {
	if testing.Short() {
		t.Skip("scores real transcripts")
	}
	kcat := kcatPath(t)
	_, events := testenv.ShortestTranscripts(t, 4)
	cluster, broker, err := broker.Start(broker.Options{Addr: "127.0.0.1:0", Partitions: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Close)
	env := testenv.ScorerEnv(t)
	env["KAFKA_BROKERS"] = broker
	env["KAFKA_INPUT_PARTITIONS"] = "1"
	env["BATCH_MAX_MESSAGES"] = "1"
	env["MAX_INFLIGHT_BATCHES"] = "2"
	metricsAddr := freeAddr(t)
	env["METRICS_ADDR"] = metricsAddr
	stop := runInProcess(t, env)
	// kcat -C fails at once on a topic that does not exist yet (it did so
	// once on a machine at load 20, the scorer still connecting): wait
	// until the scorer has created its topics and is ready.
	waitReady(t, metricsAddr, 90*time.Second)

	var in bytes.Buffer
	line := func(key string, ev *schema.TranscriptEvent) {
		if ev == nil {
			fmt.Fprintf(&in, "%s\t\n", key)
			return
		}
		b, err := json.Marshal(ev)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&in, "%s\t%s\n", key, b)
	}
	for _, ev := range events[:3] {
		long := ev
		long.VersionID = "1"
		long.Sections = map[string][]string{}
		for name, s := range ev.Sections {
			// Eight times the sentences, so version 1 scores slowest; an
			// empty section stays [] rather than null.
			long.Sections[name] = make([]string, 0, 8*len(s))
			for range 8 {
				long.Sections[name] = append(long.Sections[name], s...)
			}
		}
		short := ev
		short.VersionID = "2"
		line(ev.CallID, &long)
		line(ev.CallID, &short)
	}
	deleted := events[3]
	line(deleted.CallID, &deleted)
	line(deleted.CallID, nil)
	prod := exec.Command(kcat, "-P", "-b", broker, "-t", "transcripts", "-K", "\t", "-Z")
	prod.Stdin = &in
	if out, err := prod.CombinedOutput(); err != nil {
		t.Fatalf("kcat -P: %v\n%s", err, out)
	}

	last := map[string]kcatRecord{}
	for _, r := range kcatConsume(t, broker, "transcripts.scored", 3*2+2) {
		if r.Key == nil {
			t.Fatal("output record without a key")
		}
		last[*r.Key] = r
	}
	for _, ev := range events[:3] {
		r := last[ev.CallID]
		var st schema.ScoredTranscript
		if r.Payload == nil || json.Unmarshal([]byte(*r.Payload), &st) != nil || st.VersionID != "2" {
			t.Errorf("%s: last output record is %v, want version 2", ev.CallID, r.Payload)
			continue
		}
		if g, _ := r.header(schema.HeaderSourceGeneration); st.Source == nil || st.Source.Generation < 1 || g == "" {
			t.Errorf("%s: source %+v, generation header %q; want the group generation", ev.CallID, st.Source, g)
		}
	}
	if r := last[deleted.CallID]; r.Payload != nil {
		t.Errorf("%s: last output record has payload %q, want a tombstone (NULL)", deleted.CallID, *r.Payload)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
}
