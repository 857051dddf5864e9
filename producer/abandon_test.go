package producer

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/scorer/scorer/internal/kafkatest"
	"github.com/scorer/scorer/schema"
)

// TestAbandonedPublishNeverWritten: the broker fails every produce request
// with a retriable error until the caller gives up (its ctx ends, as at a
// revocation or the shutdown deadline), then heals. Nothing of the
// abandoned call is written afterwards, and at most one request (the one
// that may have been on the wire) reaches the broker after the call
// returned. kafka.Writer failed this: WriteMessages returned at ctx end but
// kept the batch queued and retried it, so it landed once the broker
// healed.
func TestAbandonedPublishNeverWritten(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	var healed, returned atomic.Bool
	var after, failed atomic.Int32
	c.ControlKey(kmsg.Produce.Int16(), func(req kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		if returned.Load() {
			after.Add(1)
		}
		if healed.Load() {
			return nil, nil, false
		}
		failed.Add(1)
		return kafkatest.ProduceError(req.(*kmsg.ProduceRequest), kerr.NotLeaderForPartition.Code), nil, true
	})
	cfg := testConfig(c)
	cfg.RowsTopic = ""
	p := newProducer(t, cfg)
	ctx, cancel := context.WithTimeout(t.Context(), 700*time.Millisecond)
	defer cancel()
	err := p.Publish(ctx, []schema.ScoredTranscript{sample("abandoned")})
	returned.Store(true)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Publish = %v, want deadline exceeded", err)
	}
	if failed.Load() < 2 {
		t.Fatalf("broker failed %d produce requests before the deadline; want retries (≥ 2)", failed.Load())
	}
	// A request already on the wire when the call returned may reach the
	// broker late on a loaded machine (CI with -race saw it arrive after
	// the heal and land): let it arrive while the broker still fails, so
	// what lands after the heal can only be a retry of abandoned work.
	time.Sleep(time.Second)
	healed.Store(true)
	time.Sleep(3 * time.Second) // kafka-go's writer retried within this
	if recs := readAll(t, c, topicOut, 0); len(recs) != 0 {
		t.Fatalf("%d record(s) of the abandoned call written after it returned", len(recs))
	}
	if n := after.Load(); n > 1 {
		t.Fatalf("%d produce requests reached the broker after the call returned; want at most the one in flight", n)
	}

	// The producer still works for the next call.
	if err := p.Publish(t.Context(), []schema.ScoredTranscript{sample("next")}); err != nil {
		t.Fatal(err)
	}
	if recs := readAll(t, c, topicOut, 1); len(recs) != 1 || string(recs[0].Key) != "next" {
		t.Fatalf("got %d records, want only the next call's", len(recs))
	}
}

// TestSourceHeaders: results and rows carry the input record and the
// consumer-group generation they came from, the facts a sink needs to drop
// stale writes (rows have no source field of their own).
func TestSourceHeaders(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	p := newProducer(t, testConfig(c))
	st := sample("gen")
	st.Source.Generation = 3
	if err := p.Publish(t.Context(), []schema.ScoredTranscript{st}); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		schema.HeaderSourceTopic: "transcripts", schema.HeaderSourcePartition: "1",
		schema.HeaderSourceOffset: "7", schema.HeaderSourceGeneration: "3",
	}
	for topic, n := range map[string]int{topicOut: 1, topicRows: 4} {
		recs := readAll(t, c, topic, n)
		if len(recs) != n {
			t.Fatalf("%s: %d records, want %d", topic, len(recs), n)
		}
		for _, r := range recs {
			for k, v := range want {
				if got, ok := header(r, k); !ok || got != v {
					t.Errorf("%s: header %s = %q (present %v), want %q", topic, k, got, ok, v)
				}
			}
		}
	}
}

// TestRowsWrittenInChunks: with rows flushed every BatchSize records, in
// the middle of a transcript's rows too, every row and result still lands
// exactly once.
func TestRowsWrittenInChunks(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	cfg := testConfig(c)
	cfg.BatchSize = 3 // sample has 4 rows: flushes cut through a transcript
	p := newProducer(t, cfg)
	if err := p.Publish(t.Context(), []schema.ScoredTranscript{sample("c1"), sample("c2"), sample("c3")}); err != nil {
		t.Fatal(err)
	}
	rows := readAll(t, c, topicRows, 12)
	seen := map[string]int{}
	for _, r := range rows {
		seen[string(r.Key)]++
	}
	if len(rows) != 12 || len(seen) != 12 {
		t.Fatalf("%d rows, %d distinct keys; want 12 and 12", len(rows), len(seen))
	}
	if res := readAll(t, c, topicOut, 3); len(res) != 3 {
		t.Fatalf("%d results, want 3", len(res))
	}
}
