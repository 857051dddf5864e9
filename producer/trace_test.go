package producer

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/scorer/scorer/schema"
)

// headerNames is r's header names, in order.
func headerNames(r *kgo.Record) string {
	names := make([]string, len(r.Headers))
	for i, h := range r.Headers {
		names[i] = h.Key
	}
	return strings.Join(names, ",")
}

// TestTraceContextOnOutputs: a result's and its rows' records carry the
// input's trace context (Source.Trace) after the headers they carried
// before, which are unchanged; a result without one gets none.
func TestTraceContextOnOutputs(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	p := newProducer(t, testConfig(c))
	traced, plain := sample("traced"), sample("plain")
	traced.Source = &schema.Source{Topic: "transcripts", Partition: 1, Offset: 7, Generation: 3, Trace: []schema.Header{
		{Key: "traceparent", Value: []byte("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")},
		{Key: "tracestate", Value: []byte("congo=t61rcWkgMzE")}}}
	if err := p.Publish(t.Context(), []schema.ScoredTranscript{traced, plain}); err != nil {
		t.Fatal(err)
	}
	const own = "scorer.model.sha256,scorer.content.sha256,scorer.source.topic,scorer.source.partition,scorer.source.offset,scorer.source.generation"
	check := func(what string, r *kgo.Record, callID string) {
		t.Helper()
		want := own
		if callID == "traced" {
			want += ",traceparent,tracestate"
		}
		if got := headerNames(r); got != want {
			t.Errorf("%s of %s: headers %s, want %s", what, callID, got, want)
		}
		if callID != "traced" {
			return
		}
		if v, _ := header(r, "traceparent"); v != "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01" {
			t.Errorf("%s of %s: traceparent %q", what, callID, v)
		}
		if v, _ := header(r, "tracestate"); v != "congo=t61rcWkgMzE" {
			t.Errorf("%s of %s: tracestate %q", what, callID, v)
		}
	}
	for _, r := range readAll(t, c, topicOut, 2) {
		check("result", r, string(r.Key))
	}
	for _, r := range readAll(t, c, topicRows, 8) {
		id, _, _ := strings.Cut(strings.TrimPrefix(string(r.Key), `{"call_id":"`), `"`)
		check("row", r, id)
	}
}

// TestMinimalDeadLetterKeepsTraceContext: a dead letter the broker refuses
// in full is written in minimal form without the input's other headers,
// but with its trace context, so the trace still reaches it.
func TestMinimalDeadLetterKeepsTraceContext(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	const dlq = "dlq.trace"
	createTopic(t, c, dlq, 1, nil)
	rejectProduce(c, dlq, "poison", kerr.InvalidRecord.Code)
	cfg := testConfig(c)
	cfg.DLQTopic = dlq
	p := newProducer(t, cfg)
	d := schema.DeadLetter{Key: []byte("poison"), Value: []byte("v"), Timestamp: time.Now(), Topic: "in", Offset: 11,
		Stage: schema.StageDecode, Reason: "malformed_json", ExceptionClass: "schema.DecodeError", Message: "bad",
		Headers: []schema.Header{{Key: "origin", Value: []byte("x")},
			{Key: "traceparent", Value: []byte("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")},
			{Key: "tracestate", Value: []byte("congo=t61rcWkgMzE")}}}
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	if err := p.DeadLetter(ctx, []schema.DeadLetter{d}); err != nil {
		t.Fatalf("DeadLetter = %v, want nil (the minimal form lands)", err)
	}
	r := readAll(t, c, dlq, 1)[0]
	if len(r.Key) != 0 {
		t.Fatalf("DLQ record with key %q, want the minimal form", r.Key)
	}
	if v, _ := header(r, "traceparent"); v != "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01" {
		t.Errorf("minimal dead letter traceparent %q (headers %s)", v, headerNames(r))
	}
	if v, _ := header(r, "tracestate"); v != "congo=t61rcWkgMzE" {
		t.Errorf("minimal dead letter tracestate %q (headers %s)", v, headerNames(r))
	}
	if _, ok := header(r, "origin"); ok {
		t.Errorf("minimal dead letter kept the input's header origin")
	}
	if v, _ := header(r, HeaderDLQDropped); !strings.HasPrefix(v, "key,value,headers: ") {
		t.Errorf("%s = %q, want key,value,headers: and the cause", HeaderDLQDropped, v)
	}
}
