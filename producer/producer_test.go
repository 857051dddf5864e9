package producer

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/scorer/scorer/internal/kafkatest"
	"github.com/scorer/scorer/schema"
)

func TestWriterConfig(t *testing.T) {
	c := newCluster(t)
	p := newProducer(t, testConfig(c))
	acks, bal := p.WriterConfig()
	if acks != kafka.RequireAll {
		t.Errorf("acks=%v, want RequireAll", acks)
	}
	if _, ok := bal.(kafka.Murmur2Balancer); !ok {
		t.Errorf("balancer %T, want kafka.Murmur2Balancer (the Java client's partitioner)", bal)
	}
}

func TestConfigValidate(t *testing.T) {
	good := Config{Brokers: []string{"x:9092"}, Topic: "a", DLQTopic: "d"}
	if err := good.Validate(); err != nil {
		t.Fatal(err)
	}
	if good.Format != FormatJSON || good.Compression != "snappy" || good.BatchBytes != DefaultBatchBytes {
		t.Errorf("defaults not applied: %+v", good)
	}
	for name, c := range map[string]Config{
		"no brokers":   {Topic: "a", DLQTopic: "d"},
		"no topic":     {Brokers: []string{"x"}, DLQTopic: "d"},
		"no dlq":       {Brokers: []string{"x"}, Topic: "a"},
		"same topics":  {Brokers: []string{"x"}, Topic: "a", DLQTopic: "a"},
		"rows is dlq":  {Brokers: []string{"x"}, Topic: "a", DLQTopic: "d", RowsTopic: "d"},
		"bad format":   {Brokers: []string{"x"}, Topic: "a", DLQTopic: "d", Format: "avro"},
		"bad codec":    {Brokers: []string{"x"}, Topic: "a", DLQTopic: "d", Compression: "brotli"},
		"negative":     {Brokers: []string{"x"}, Topic: "a", DLQTopic: "d", BatchSize: -1},
		"empty broker": {Brokers: []string{" "}, Topic: "a", DLQTopic: "d"},
	} {
		if err := c.Validate(); err == nil || !strings.HasPrefix(err.Error(), "producer: ") {
			t.Errorf("%s: Validate() = %v, want a producer: error", name, err)
		}
	}
}

func TestPublishJSON(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	reg := prometheus.NewRegistry()
	p, err := New(testConfig(c), zerolog.Nop(), reg)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close(context.Background())
	sts := []schema.ScoredTranscript{sample("call-1"), sample("call-2")}
	if err := p.Publish(t.Context(), sts); err != nil {
		t.Fatal(err)
	}
	// Publish returned, so everything must be readable now (acks=all).
	recs := readAll(t, c, topicOut, 2)
	if len(recs) != 2 {
		t.Fatalf("got %d records, want 2 (no duplicates)", len(recs))
	}
	seen := map[string]bool{}
	for _, r := range recs {
		var st schema.ScoredTranscript
		if err := json.Unmarshal(r.Value, &st); err != nil {
			t.Fatal(err)
		}
		if string(r.Key) != st.CallID {
			t.Errorf("key %q for call %q", r.Key, st.CallID)
		}
		if st.Source == nil || st.Source.Offset != 7 {
			t.Errorf("source lost: %+v", st.Source)
		}
		seen[st.CallID] = true
		if v, _ := header(r, schema.HeaderModelSHA256); v != "abc123" {
			t.Errorf("model header %q", v)
		}
		sum := sha256.Sum256(r.Value)
		if v, _ := header(r, schema.HeaderContentSHA256); v != hex.EncodeToString(sum[:]) {
			t.Errorf("content header %q does not hash the value", v)
		}
	}
	if !seen["call-1"] || !seen["call-2"] {
		t.Errorf("missing calls: %v", seen)
	}

	rows := readAll(t, c, topicRows, 8)
	if len(rows) != 8 { // 2 calls × 2 sentences × 2 labels
		t.Fatalf("got %d rows, want 8", len(rows))
	}
	for _, r := range rows {
		var k schema.RowKey
		var row schema.ScoreRow
		if err := json.Unmarshal(r.Key, &k); err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(r.Value, &row); err != nil {
			t.Fatal(err)
		}
		if k != row.Key() {
			t.Errorf("row key %+v does not match row %+v", k, row.Key())
		}
	}
	if got := counter(t, reg, topicOut, kindResult); got != 2 {
		t.Errorf("results metric = %v", got)
	}
	if got := counter(t, reg, topicRows, kindRow); got != 8 {
		t.Errorf("rows metric = %v", got)
	}
	if n := histogramCount(t, reg, "scorer_produce_seconds"); n < 2 {
		t.Errorf("produce_seconds count = %d, want ≥2 (rows then results)", n)
	}
}

func TestPublishConnect(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	cfg := testConfig(c)
	cfg.Format = FormatConnect
	cfg.Compression = "lz4"
	p := newProducer(t, cfg)
	if err := p.Publish(t.Context(), []schema.ScoredTranscript{sample("call-c")}); err != nil {
		t.Fatal(err)
	}
	recs := readAll(t, c, topicOut, 1)
	var env struct {
		Schema  schema.ConnectSchema    `json:"schema"`
		Payload schema.ScoredTranscript `json:"payload"`
	}
	if err := json.Unmarshal(recs[0].Value, &env); err != nil {
		t.Fatal(err)
	}
	if string(recs[0].Key) != "call-c" || env.Schema.Type != "struct" || env.Schema.Name != "scorer.ScoredTranscript" || env.Payload.CallID != "call-c" {
		t.Errorf("bad connect record key=%q schema=%+v payload=%+v", recs[0].Key, env.Schema.Name, env.Payload.CallID)
	}
	rows := readAll(t, c, topicRows, 4)
	var key struct {
		Schema  schema.ConnectSchema `json:"schema"`
		Payload schema.RowKey        `json:"payload"`
	}
	if err := json.Unmarshal(rows[0].Key, &key); err != nil || key.Schema.Name != "scorer.RowKey" || key.Payload.CallID != "call-c" {
		t.Errorf("row key is not a RowKey envelope: %s (%v)", rows[0].Key, err)
	}
}

func TestDeadLetter(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	p := newProducer(t, testConfig(c))
	ts := time.Date(2024, 3, 4, 5, 6, 7, 0, time.UTC)
	dl := schema.DeadLetter{
		Key: []byte("bad-1"), Value: []byte("{not json"),
		Headers:   []schema.Header{{Key: "trace", Value: []byte("t1")}},
		Timestamp: ts, Topic: "transcripts", Partition: 2, Offset: 99,
		Stage: schema.StageDecode, Reason: "malformed_json", ExceptionClass: "schema.DecodeError", Message: "boom",
	}
	if err := p.DeadLetter(t.Context(), []schema.DeadLetter{dl}); err != nil {
		t.Fatal(err)
	}
	recs := readAll(t, c, topicDLQ, 1)
	if len(recs) != 1 {
		t.Fatalf("got %d DLQ records", len(recs))
	}
	r := recs[0]
	if string(r.Key) != "bad-1" || string(r.Value) != "{not json" || !r.Timestamp.Equal(ts) {
		t.Errorf("DLQ record key=%q value=%q ts=%v", r.Key, r.Value, r.Timestamp)
	}
	if r.Headers[0].Key != "trace" {
		t.Errorf("original header not first: %+v", r.Headers)
	}
	for k, v := range map[string]string{
		"trace": "t1", schema.HeaderErrorsTopic: "transcripts", schema.HeaderErrorsPartition: "2",
		schema.HeaderErrorsOffset: "99", schema.HeaderErrorsStage: "VALUE_CONVERTER",
		schema.HeaderErrorsExceptionClass: "schema.DecodeError", schema.HeaderErrorsExceptionMsg: "boom",
		schema.HeaderDLQReason: "malformed_json",
	} {
		if got, ok := header(r, k); !ok || got != v {
			t.Errorf("header %s = %q (%v), want %q", k, got, ok, v)
		}
	}
}

func TestDeadLetterDropsOversizeValue(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	cfg := testConfig(c)
	cfg.BatchBytes = 4096
	p := newProducer(t, cfg)
	dl := schema.DeadLetter{Key: []byte("k"), Value: make([]byte, 10000), Topic: "in", Reason: "too_large"}
	if err := p.DeadLetter(t.Context(), []schema.DeadLetter{dl}); err != nil {
		t.Fatal(err)
	}
	r := readAll(t, c, topicDLQ, 1)[0]
	if len(r.Value) != 0 {
		t.Errorf("value kept (%d bytes)", len(r.Value))
	}
	if v, _ := header(r, HeaderDLQValueDropped); v != "10000" {
		t.Errorf("dropped header = %q", v)
	}
}

func TestPublishOversizeIsPermanent(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	cfg := testConfig(c)
	cfg.BatchBytes = 64 << 10
	p := newProducer(t, cfg)
	big := sample("big")
	lr := big.Sections["FILT_MD"].Results["x"]
	lr.Matches = []string{strings.Repeat("m", 100<<10)}
	big.Sections["FILT_MD"].Results["x"] = lr
	err := p.Publish(t.Context(), []schema.ScoredTranscript{sample("ok-1"), big, sample("ok-2")})
	var pe *PermanentError
	if !errors.As(err, &pe) || !pe.Permanent() {
		t.Fatalf("Publish = %v, want *PermanentError", err)
	}
	if len(pe.Indexes) != 1 || pe.Indexes[0] != 1 || pe.CallIDs[0] != "big" {
		t.Errorf("permanent error names %v %v, want index 1 (big)", pe.Indexes, pe.CallIDs)
	}
	if !errors.Is(err, kafka.MessageSizeTooLarge) {
		t.Errorf("cause %v is not MessageSizeTooLarge", err)
	}
	recs := readAll(t, c, topicOut, 2)
	if len(recs) != 2 {
		t.Fatalf("got %d records, want the 2 good ones", len(recs))
	}
	for _, r := range recs {
		if string(r.Key) == "big" {
			t.Error("oversize transcript was written")
		}
	}
	// Its rows must not be written either (results and rows stay consistent).
	for _, r := range readAll(t, c, topicRows, 8) {
		if strings.Contains(string(r.Key), `"big"`) {
			t.Error("row of the rejected transcript was written")
		}
	}
}

// TestBrokerRejectsOversize covers the broker-side check: the writer's
// BatchBytes is larger than the topic's max.message.bytes, so the broker
// answers MESSAGE_TOO_LARGE and Publish must not retry it forever.
func TestBrokerRejectsOversize(t *testing.T) {
	t.Parallel()
	c := newCluster(t, kfake.BrokerConfigs(map[string]string{"message.max.bytes": "20000"}))
	cfg := testConfig(c)
	cfg.RowsTopic = ""
	cfg.Compression = "none"
	cfg.BatchBytes = 1 << 20
	p := newProducer(t, cfg)
	big := sample("big")
	big.Labels = []string{strings.Repeat("l", 50000)}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	err := p.Publish(ctx, []schema.ScoredTranscript{big})
	var pe *PermanentError
	if !errors.As(err, &pe) {
		t.Fatalf("Publish = %v, want *PermanentError", err)
	}
}

// TestRetryAfterBrokerFault fails the first Produce request with a retriable
// error; the producer's own loop (kafka-go retries disabled) must resend and
// the record must arrive exactly once.
func TestRetryAfterBrokerFault(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	var produces, failed atomic.Int32
	c.ControlKey(kmsg.Produce.Int16(), func(req kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		produces.Add(1)
		if failed.Load() > 0 {
			return nil, nil, false
		}
		failed.Add(1)
		return kafkatest.ProduceError(req.(*kmsg.ProduceRequest), kerr.NotLeaderForPartition.Code), nil, true
	})
	cfg := testConfig(c)
	cfg.RowsTopic = ""
	p := newProducer(t, cfg)
	if err := p.Publish(t.Context(), []schema.ScoredTranscript{sample("retry-me")}); err != nil {
		t.Fatal(err)
	}
	if failed.Load() != 1 || produces.Load() < 2 {
		t.Fatalf("fault injected %d times over %d produce requests; want 1 over ≥2", failed.Load(), produces.Load())
	}
	recs := readAll(t, c, topicOut, 1)
	if len(recs) != 1 || string(recs[0].Key) != "retry-me" {
		t.Fatalf("got %d records, want exactly one", len(recs))
	}
}

func TestPublishCancelled(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	c.ControlKey(kmsg.Produce.Int16(), func(kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		return nil, errors.New("drop connection"), true
	})
	cfg := testConfig(c)
	cfg.RowsTopic = ""
	p := newProducer(t, cfg)
	ctx, cancel := context.WithTimeout(t.Context(), 500*time.Millisecond)
	defer cancel()
	start := time.Now()
	err := p.Publish(ctx, []schema.ScoredTranscript{sample("never")})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Publish = %v, want deadline exceeded", err)
	}
	if time.Since(start) > 5*time.Second {
		t.Errorf("Publish took %v after ctx ended", time.Since(start))
	}
}

func TestCloseBoundedAndClosed(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	p := newProducer(t, testConfig(c))
	if err := p.Publish(t.Context(), []schema.ScoredTranscript{sample("a")}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	if err := p.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if err := p.Publish(t.Context(), []schema.ScoredTranscript{sample("b")}); !errors.Is(err, ErrClosed) {
		t.Errorf("Publish after Close = %v", err)
	}
	if err := p.DeadLetter(t.Context(), nil); !errors.Is(err, ErrClosed) {
		t.Errorf("DeadLetter after Close = %v", err)
	}
}

func TestEnsureTopics(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	specs := []TopicSpec{{Name: "new.topic", Partitions: 2}, {Name: topicOut, Partitions: 3}}
	for range 2 { // idempotent
		if err := EnsureTopics(ctx, c.ListenAddrs(), nil, specs...); err != nil {
			t.Fatal(err)
		}
	}
	conn, err := kafka.DialContext(ctx, "tcp", c.ListenAddrs()[0])
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	parts, err := conn.ReadPartitions("new.topic")
	if err != nil || len(parts) != 2 {
		t.Fatalf("new.topic partitions = %d, %v", len(parts), err)
	}
}

// counter reads scorer_messages_out_total{topic,kind} from reg.
func counter(t *testing.T, reg *prometheus.Registry, topic, kind string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "scorer_messages_out_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["topic"] == topic && labels["kind"] == kind {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

func histogramCount(t *testing.T, reg *prometheus.Registry, name string) uint64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetHistogram().GetSampleCount()
		}
	}
	return 0
}
