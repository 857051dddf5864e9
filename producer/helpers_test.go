package producer

import (
	"context"
	"io"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/scorer/scorer/schema"
)

const (
	topicOut  = "transcripts.scored"
	topicRows = "transcripts.rows"
	topicDLQ  = "transcripts.dlq"
)

// newCluster starts an in-process kfake broker with the output topics.
func newCluster(t *testing.T, opts ...kfake.Opt) *kfake.Cluster {
	t.Helper()
	opts = append([]kfake.Opt{kfake.NumBrokers(1), kfake.SeedTopics(3, topicOut, topicRows, topicDLQ)}, opts...)
	c, err := kfake.NewCluster(opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

func testConfig(c *kfake.Cluster) Config {
	return Config{Brokers: c.ListenAddrs(), Topic: topicOut, RowsTopic: topicRows, DLQTopic: topicDLQ}
}

func newProducer(t *testing.T, cfg Config) *Producer {
	t.Helper()
	p, err := New(cfg, zerolog.New(io.Discard), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = p.Close(ctx)
	})
	return p
}

// readAll consumes topic from the start with franz-go (an independent
// client, so the test does not trust kafka-go to read what kafka-go wrote)
// until want records arrived or the deadline passed.
func readAll(t *testing.T, c *kfake.Cluster, topic string, want int) []*kgo.Record {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	var recs []*kgo.Record
	for len(recs) < want {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("read %d of %d records from %s before the deadline", len(recs), want, topic)
		}
		for _, e := range fs.Errors() {
			t.Fatalf("fetch %s: %v", topic, e.Err)
		}
		recs = append(recs, fs.Records()...)
	}
	// Give a duplicate the chance to show up.
	short, cancel2 := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel2()
	recs = append(recs, cl.PollFetches(short).Records()...)
	return recs
}

func header(r *kgo.Record, key string) (string, bool) {
	for _, h := range r.Headers {
		if h.Key == key {
			return string(h.Value), true
		}
	}
	return "", false
}

// sample returns a small ScoredTranscript with n sentences per section.
func sample(callID string) schema.ScoredTranscript {
	return schema.ScoredTranscript{
		CallID: callID, EntityID: "E", EventTime: "2024-01-02T03:04:05Z",
		Model:              schema.ModelInfo{Name: "m", SHA256: "abc123"},
		HypothesisTemplate: "This text is about {}.", ScoreMode: "softmax", Threshold: 0.5,
		Labels: []string{"x", "y"},
		Sections: map[string]schema.SectionResult{
			"FILT_MD": {Sentences: 2, Results: map[string]schema.LabelResult{
				"x": {Scores: []float32{0.9, 0.1}, Flags: []int{1, 0}, Matches: []string{"s0"}},
				"y": {Scores: []float32{0.2, 0.3}, Flags: []int{0, 0}, Matches: []string{}},
			}},
		},
		ScoredAt: "2024-01-02T03:04:06Z",
		Source:   &schema.Source{Topic: "transcripts", Partition: 1, Offset: 7},
	}
}
