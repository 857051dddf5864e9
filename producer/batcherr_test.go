package producer

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/scorer/scorer/internal/kafkatest"
	"github.com/scorer/scorer/schema"
)

// createTopic adds a topic with the given partitions and topic configs (such
// as max.message.bytes) to c.
func createTopic(t *testing.T, c *kfake.Cluster, name string, partitions int, configs map[string]string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if err := EnsureTopics(ctx, c.ListenAddrs(), nil, TopicSpec{Name: name, Partitions: partitions, Configs: configs}); err != nil {
		t.Fatal(err)
	}
}

// rejectProduce makes every produce request to topic whose record bytes
// contain marker fail with code; other requests reach the broker unchanged.
// kafka-go sends one topic-partition per produce request, so one answer
// covers the whole request.
func rejectProduce(c *kfake.Cluster, topic, marker string, code int16) {
	c.ControlKey(kmsg.Produce.Int16(), func(req kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		preq := req.(*kmsg.ProduceRequest)
		hit := false
		for _, rt := range preq.Topics {
			for _, rp := range rt.Partitions {
				if rt.Topic == topic && bytes.Contains(rp.Records, []byte(marker)) {
					hit = true
				}
			}
		}
		if !hit {
			return nil, nil, false
		}
		return kafkatest.ProduceError(preq, code), nil, true
	})
}

// bigSample returns a transcript whose JSON is a little over n bytes.
func bigSample(callID string, n int) schema.ScoredTranscript {
	st := sample(callID)
	lr := st.Sections["FILT_MD"].Results["x"]
	lr.Matches = []string{strings.Repeat("m", n)}
	st.Sections["FILT_MD"].Results["x"] = lr
	return st
}

// TestBatchTooLargeResentIndividually: the topic's max.message.bytes is below
// the writer's BatchBytes, so records that each fit are rejected together
// (MESSAGE_TOO_LARGE covers the whole partition batch). Only the record that
// does not fit alone may be reported permanent; the rest must land once.
func TestBatchTooLargeResentIndividually(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	const topic = "small.out"
	createTopic(t, c, topic, 1, map[string]string{"max.message.bytes": "150000"})
	cfg := testConfig(c)
	cfg.Topic, cfg.RowsTopic, cfg.Compression = topic, "", "none"
	p := newProducer(t, cfg)

	var sts []schema.ScoredTranscript
	for i := range 6 {
		n := 100 << 10
		if i == 2 {
			n = 200 << 10 // over max.message.bytes even alone
		}
		sts = append(sts, bigSample(fmt.Sprintf("call-%d", i), n))
	}
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	err := p.Publish(ctx, sts)
	var pe *PermanentError
	if !errors.As(err, &pe) {
		t.Fatalf("Publish = %v, want *PermanentError", err)
	}
	if !slices.Equal(pe.FailedIndexes(), []int{2}) {
		t.Fatalf("permanent indexes %v (call_ids %v), want [2]: records that fit alone were declared permanent", pe.FailedIndexes(), pe.CallIDs)
	}
	if !errors.Is(err, kafka.MessageSizeTooLarge) {
		t.Errorf("cause %v is not MessageSizeTooLarge", err)
	}
	recs := readAll(t, c, topic, 5)
	keys := map[string]int{}
	for _, r := range recs {
		keys[string(r.Key)]++
	}
	for i := range 6 {
		want := 1
		if i == 2 {
			want = 0
		}
		if got := keys["call-"+strconv.Itoa(i)]; got != want {
			t.Errorf("call-%d written %d times, want %d", i, got, want)
		}
	}
}

// TestBatchTooLargeResendKeepsOrder: eleven 100 KiB records to one partition
// go as two requests, [0..9] (over the topic's max.message.bytes, rejected
// whole) and [10] (not sent behind it). Records 0 and 10 are two versions of
// one call: the resend of 0..9 one per request must land before 10, or an
// upsert sink ends on the older version.
func TestBatchTooLargeResendKeepsOrder(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	const topic = "small.ordered"
	createTopic(t, c, topic, 1, map[string]string{"max.message.bytes": "150000"})
	cfg := testConfig(c)
	cfg.Topic, cfg.RowsTopic, cfg.Compression = topic, "", "none"
	p := newProducer(t, cfg)

	var sts []schema.ScoredTranscript
	for i := range 11 {
		id := fmt.Sprintf("call-%d", i)
		if i == 10 {
			id = "call-0"
		}
		st := bigSample(id, 100<<10)
		st.Source.Offset = int64(i)
		sts = append(sts, st)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	if err := p.Publish(ctx, sts); err != nil {
		t.Fatalf("Publish = %v, want nil (every record fits alone)", err)
	}
	var order []string
	for _, r := range readAll(t, c, topic, 11) {
		off, _ := header(r, schema.HeaderSourceOffset)
		order = append(order, off)
	}
	if len(order) != 11 {
		t.Fatalf("read %d records %v, want 11", len(order), order)
	}
	if first, second := slices.Index(order, "0"), slices.Index(order, "10"); first < 0 || second < first {
		t.Fatalf("source offsets in topic order %v: call-0's second version (10) landed before its first (0)", order)
	}
}

// TestDeadLetterBatchRejectionIsolated: one poisoned dead letter makes the
// broker reject its partition batch (INVALID_RECORD). Its neighbours must
// land in full; it lands in minimal form; DeadLetter succeeds.
func TestDeadLetterBatchRejectionIsolated(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	const dlq = "dlq.one"
	createTopic(t, c, dlq, 1, nil)
	rejectProduce(c, dlq, "poison", kerr.InvalidRecord.Code)
	cfg := testConfig(c)
	cfg.DLQTopic, cfg.Compression = dlq, "none"
	p := newProducer(t, cfg)

	ts := time.Date(2024, 3, 4, 5, 6, 7, 0, time.UTC)
	dls := []schema.DeadLetter{
		{Key: []byte("ok-0"), Value: []byte("v0"), Timestamp: ts, Topic: "in", Offset: 10, Reason: "malformed_json"},
		{Key: []byte("poison"), Value: []byte("v1"), Headers: []schema.Header{{Key: "trace", Value: []byte("t")}},
			Timestamp: ts, Topic: "in", Partition: 1, Offset: 11, Stage: schema.StageDecode,
			Reason: "malformed_json", ExceptionClass: "schema.DecodeError", Message: strings.Repeat("e", 5000)},
		{Key: []byte("ok-2"), Value: []byte("v2"), Timestamp: ts, Topic: "in", Offset: 12, Reason: "malformed_json"},
	}
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	if err := p.DeadLetter(ctx, dls); err != nil {
		t.Fatalf("DeadLetter = %v, want nil (the poisoned one lands in minimal form)", err)
	}
	recs := readAll(t, c, dlq, 3)
	if len(recs) != 3 {
		t.Fatalf("got %d DLQ records, want 3", len(recs))
	}
	var minimal *kgo.Record
	for _, r := range recs {
		switch string(r.Key) {
		case "ok-0", "ok-2":
			if !r.Timestamp.Equal(ts) || len(r.Value) != 2 {
				t.Errorf("full dead letter %q changed: value %q ts %v", r.Key, r.Value, r.Timestamp)
			}
			if _, ok := header(r, HeaderDLQDropped); ok {
				t.Errorf("full dead letter %q has %s", r.Key, HeaderDLQDropped)
			}
		case "":
			minimal = r
		default:
			t.Errorf("unexpected DLQ key %q (the poisoned record kept its key)", r.Key)
		}
	}
	if minimal == nil {
		t.Fatal("no minimal dead letter")
	}
	checkMinimal(t, minimal, dls[1], "key,value,headers")
	if msg, _ := header(minimal, schema.HeaderErrorsExceptionMsg); len(msg) >= 5000 || !strings.HasPrefix(msg, "eee") {
		t.Errorf("exception message not truncated: %d bytes", len(msg))
	}
}

// checkMinimal checks that r is the minimal form of d.
func checkMinimal(t *testing.T, r *kgo.Record, d schema.DeadLetter, dropped string) {
	t.Helper()
	if len(r.Key) != 0 || len(r.Value) != 0 {
		t.Errorf("minimal dead letter kept key %q or %d value bytes", r.Key, len(r.Value))
	}
	if time.Since(r.Timestamp) > time.Minute {
		t.Errorf("minimal dead letter timestamp %v, want now", r.Timestamp)
	}
	for _, h := range d.Headers {
		if _, ok := header(r, h.Key); ok {
			t.Errorf("minimal dead letter kept original header %q", h.Key)
		}
	}
	for k, v := range map[string]string{
		schema.HeaderErrorsTopic: d.Topic, schema.HeaderErrorsPartition: strconv.Itoa(d.Partition),
		schema.HeaderErrorsOffset: strconv.FormatInt(d.Offset, 10), schema.HeaderErrorsStage: d.Stage,
		schema.HeaderErrorsExceptionClass: d.ExceptionClass, schema.HeaderDLQReason: d.Reason,
	} {
		if got, ok := header(r, k); !ok || got != v {
			t.Errorf("minimal header %s = %q (%v), want %q", k, got, ok, v)
		}
	}
	if _, ok := header(r, schema.HeaderErrorsExceptionMsg); !ok {
		t.Errorf("minimal dead letter has no %s", schema.HeaderErrorsExceptionMsg)
	}
	if got, _ := header(r, HeaderDLQDropped); !strings.HasPrefix(got, dropped+": ") || len(got) <= len(dropped)+2 {
		t.Errorf("%s = %q, want %q plus the cause", HeaderDLQDropped, got, dropped+": …")
	}
}

// TestDeadLetterInvalidTimestamp: the broker rejects the dead letter's
// original (old) timestamp. That is permanent for a dead letter, and the
// minimal form, stamped now, lands.
func TestDeadLetterInvalidTimestamp(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	const dlq = "dlq.ts"
	createTopic(t, c, dlq, 1, nil)
	cutoff := time.Now().Add(-time.Hour).UnixMilli()
	c.ControlKey(kmsg.Produce.Int16(), func(req kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		preq := req.(*kmsg.ProduceRequest)
		old := false
		for _, rt := range preq.Topics {
			for _, rp := range rt.Partitions {
				var b kmsg.RecordBatch
				if err := b.ReadFrom(rp.Records); err == nil && rt.Topic == dlq && b.FirstTimestamp < cutoff {
					old = true
				}
			}
		}
		if !old {
			return nil, nil, false
		}
		return kafkatest.ProduceError(preq, kerr.InvalidTimestamp.Code), nil, true
	})
	cfg := testConfig(c)
	cfg.DLQTopic = dlq
	p := newProducer(t, cfg)
	d := schema.DeadLetter{Key: []byte("old"), Value: []byte("v"), Timestamp: time.Date(2001, 1, 1, 0, 0, 0, 0, time.UTC),
		Topic: "in", Partition: 0, Offset: 3, Stage: schema.StageDecode, Reason: "malformed_json", ExceptionClass: "E", Message: "m"}
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	if err := p.DeadLetter(ctx, []schema.DeadLetter{d}); err != nil {
		t.Fatalf("DeadLetter = %v, want nil", err)
	}
	r := readAll(t, c, dlq, 1)[0]
	checkMinimal(t, r, d, "key,value")
	if got, _ := header(r, HeaderDLQDropped); !strings.Contains(strings.ToLower(got), "timestamp") {
		t.Errorf("%s = %q does not name the timestamp error", HeaderDLQDropped, got)
	}
}

// TestDeadLetterBrokerTooLarge: the DLQ topic's max.message.bytes is far
// below BatchBytes, so only the broker can reject the dead letter; the
// minimal form lands and records how big the value was.
func TestDeadLetterBrokerTooLarge(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	const dlq = "dlq.small"
	createTopic(t, c, dlq, 1, map[string]string{"max.message.bytes": "2000"})
	cfg := testConfig(c)
	cfg.DLQTopic, cfg.Compression = dlq, "none"
	p := newProducer(t, cfg)
	d := schema.DeadLetter{Key: []byte("k"), Value: make([]byte, 5000), Timestamp: time.Now(), Topic: "in", Offset: 1,
		Stage: schema.StageDecode, Reason: "too_large", ExceptionClass: "E", Message: "m"}
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	if err := p.DeadLetter(ctx, []schema.DeadLetter{d}); err != nil {
		t.Fatalf("DeadLetter = %v, want nil", err)
	}
	r := readAll(t, c, dlq, 1)[0]
	checkMinimal(t, r, d, "key,value")
	if v, _ := header(r, HeaderDLQValueDropped); v != "5000" {
		t.Errorf("%s = %q, want 5000", HeaderDLQValueDropped, v)
	}
}

// TestDeadLetterKeyOrHeadersTooLarge: a key or headers alone over BatchBytes
// used to make the dead letter permanent; the minimal form must land.
func TestDeadLetterKeyOrHeadersTooLarge(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	cfg := testConfig(c)
	cfg.BatchBytes = 4096
	p := newProducer(t, cfg)
	dls := []schema.DeadLetter{
		{Key: bytes.Repeat([]byte("k"), 10000), Value: []byte("v"), Topic: "in", Offset: 1, Reason: "too_large", Stage: schema.StageDecode, ExceptionClass: "E"},
		{Key: []byte("k2"), Headers: []schema.Header{{Key: "h", Value: make([]byte, 10000)}}, Topic: "in", Offset: 2, Reason: "too_large", Stage: schema.StageDecode, ExceptionClass: "E"},
	}
	if err := p.DeadLetter(t.Context(), dls); err != nil {
		t.Fatalf("DeadLetter = %v, want nil", err)
	}
	recs := readAll(t, c, topicDLQ, 2)
	if len(recs) != 2 {
		t.Fatalf("got %d DLQ records, want 2", len(recs))
	}
	for _, r := range recs {
		off, _ := header(r, schema.HeaderErrorsOffset)
		switch off {
		case "1":
			checkMinimal(t, r, dls[0], "key,value")
		case "2":
			checkMinimal(t, r, dls[1], "key,headers")
		default:
			t.Errorf("unexpected record with offset header %q", off)
		}
	}
}

// TestDeadLetterMinimalAlsoFails: a dead letter the broker rejects even in
// minimal form is the only one reported in the *PermanentError; the others
// land.
func TestDeadLetterMinimalAlsoFails(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	const dlq = "dlq.doomed"
	createTopic(t, c, dlq, 1, nil)
	// The marker is in the source topic name, which the minimal form keeps.
	rejectProduce(c, dlq, "doomed-src", kerr.InvalidRecord.Code)
	cfg := testConfig(c)
	cfg.DLQTopic, cfg.Compression = dlq, "none"
	p := newProducer(t, cfg)
	dls := []schema.DeadLetter{
		{Key: []byte("a"), Value: []byte("v"), Topic: "in", Offset: 1, Reason: "r"},
		{Key: []byte("b"), Value: []byte("v"), Topic: "doomed-src", Offset: 2, Reason: "r"},
		{Key: []byte("c"), Value: []byte("v"), Topic: "in", Offset: 3, Reason: "r"},
	}
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	err := p.DeadLetter(ctx, dls)
	var pe *PermanentError
	if !errors.As(err, &pe) || !slices.Equal(pe.FailedIndexes(), []int{1}) {
		t.Fatalf("DeadLetter = %v, want *PermanentError naming index 1", err)
	}
	if !errors.Is(err, kafka.InvalidRecord) {
		t.Errorf("cause %v is not InvalidRecord", err)
	}
	recs := readAll(t, c, dlq, 2)
	got := map[string]bool{}
	for _, r := range recs {
		got[string(r.Key)] = true
	}
	if len(recs) != 2 || !got["a"] || !got["c"] {
		t.Errorf("DLQ holds %v, want a and c once each", got)
	}
}
