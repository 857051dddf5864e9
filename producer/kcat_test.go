package producer

import (
	"bytes"
	"context"
	"encoding/json"
	"os/exec"
	"testing"
	"time"

	"github.com/scorer/scorer/schema"
)

// TestKcatReadsDLQ reads the DLQ back with kcat (librdkafka), a client that
// shares no code with kafka-go or franz-go, to prove the Connect error
// headers are readable by standard tooling. CI installs kcat; a missing
// kcat fails the test rather than silently skipping the interop check.
func TestKcatReadsDLQ(t *testing.T) {
	kcat, err := exec.LookPath("kcat")
	if err != nil {
		t.Fatalf("kcat not found on PATH (install it: apt-get install -y kcat): %v", err)
	}
	c := newCluster(t)
	p := newProducer(t, testConfig(c))
	dl := schema.DeadLetter{
		Key: []byte("bad-kcat"), Value: []byte(`{"call_id":`),
		Headers:   []schema.Header{{Key: "trace", Value: []byte("t-9")}},
		Timestamp: time.UnixMilli(1700000000123), Topic: "transcripts", Partition: 1, Offset: 5,
		Stage: schema.StageDecode, Reason: "malformed_json", ExceptionClass: "schema.DecodeError",
		Message: "unexpected end of JSON input",
	}
	if err := p.DeadLetter(t.Context(), []schema.DeadLetter{dl}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, kcat, "-C", "-b", c.ListenAddrs()[0], "-t", topicDLQ, "-J", "-e", "-q")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("kcat: %v\n%s", err, stderr.String())
	}
	// kcatRecord is the subset of kcat -J output checked here; headers
	// come as a flat [name, value, name, value, …] array.
	type kcatRecord struct {
		Key     string   `json:"key"`
		Payload string   `json:"payload"`
		Ts      int64    `json:"ts"`
		Headers []string `json:"headers"`
	}
	var recs []kcatRecord
	for _, line := range bytes.Split(bytes.TrimSpace(out), []byte("\n")) {
		if len(line) == 0 {
			continue
		}
		var r kcatRecord
		if err := json.Unmarshal(line, &r); err != nil {
			t.Fatalf("kcat line %q: %v", line, err)
		}
		recs = append(recs, r)
	}
	if len(recs) != 1 {
		t.Fatalf("kcat read %d records, want 1:\n%s\n%s", len(recs), out, stderr.String())
	}
	r := recs[0]
	if r.Key != "bad-kcat" || r.Payload != `{"call_id":` || r.Ts != 1700000000123 {
		t.Errorf("kcat record key=%q payload=%q ts=%d", r.Key, r.Payload, r.Ts)
	}
	want := []string{
		"trace", "t-9",
		schema.HeaderErrorsTopic, "transcripts",
		schema.HeaderErrorsPartition, "1",
		schema.HeaderErrorsOffset, "5",
		schema.HeaderErrorsStage, "VALUE_CONVERTER",
		schema.HeaderErrorsExceptionClass, "schema.DecodeError",
		schema.HeaderErrorsExceptionMsg, "unexpected end of JSON input",
		schema.HeaderDLQReason, "malformed_json",
	}
	if len(r.Headers) != len(want) {
		t.Fatalf("kcat headers %q, want %q", r.Headers, want)
	}
	for i := range want {
		if r.Headers[i] != want[i] {
			t.Errorf("kcat header[%d] = %q, want %q", i, r.Headers[i], want[i])
		}
	}
}

// TestKcatReadsTombstone: Delete writes a real tombstone — the key with a
// null value, what log compaction and a JDBC sink with delete.enabled=true
// act on — as kcat (librdkafka) reads it: payload null, not "".
func TestKcatReadsTombstone(t *testing.T) {
	kcat, err := exec.LookPath("kcat")
	if err != nil {
		t.Fatalf("kcat not found on PATH (install it: apt-get install -y kcat): %v", err)
	}
	c := newCluster(t)
	p := newProducer(t, testConfig(c))
	if err := p.Delete(t.Context(), []schema.Delete{{CallID: "gone-1"}, {CallID: "gone-2"}}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, kcat, "-C", "-b", c.ListenAddrs()[0], "-t", topicOut, "-J", "-e", "-q")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("kcat: %v\n%s", err, stderr.String())
	}
	keys := map[string]bool{}
	for _, line := range bytes.Split(bytes.TrimSpace(out), []byte("\n")) {
		var r struct {
			Key     string  `json:"key"`
			Payload *string `json:"payload"`
		}
		if err := json.Unmarshal(line, &r); err != nil {
			t.Fatalf("kcat line %q: %v", line, err)
		}
		if r.Payload != nil {
			t.Errorf("key %s: payload %q, want null (a tombstone)", r.Key, *r.Payload)
		}
		keys[r.Key] = true
	}
	if len(keys) != 2 || !keys["gone-1"] || !keys["gone-2"] {
		t.Fatalf("kcat read keys %v, want gone-1 and gone-2:\n%s", keys, out)
	}
}
