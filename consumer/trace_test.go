package consumer

import (
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
)

// TestTraceContextCarried: each result carries its own input record's
// trace context (Source.Trace: traceparent, then tracestate, and nothing
// else of the record's headers), two versions of one call each their own;
// a record without one gives a result without.
func TestTraceContextCarried(t *testing.T) {
	t.Parallel()
	const topic, group = "trace", "g-trace"
	_, brokers := newCluster(t, topic, 1)
	msgs := msgsFor(0, []string{"call", "call", "plain"})
	msgs[0].Headers = append(msgs[0].Headers, kafka.Header{Key: "tracestate", Value: []byte("v=1")},
		kafka.Header{Key: "traceparent", Value: []byte("00-01-01-01")})
	msgs[1].Headers = append(msgs[1].Headers, kafka.Header{Key: "traceparent", Value: []byte("00-02-02-01")})
	produce(t, brokers, topic, msgs)
	sk := &fakeSink{}
	startMetered(t, testConfig(brokers, topic, group), &fakeScorer{}, sk)
	eventually(t, 20*time.Second, "three results", func() bool { return len(sk.Published()) == 3 })
	want := map[int64]string{0: "traceparent=00-01-01-01,tracestate=v=1", 1: "traceparent=00-02-02-01", 2: ""}
	for _, st := range sk.Published() {
		if st.Source == nil {
			t.Fatalf("%s: no source", st.CallID)
		}
		got := ""
		for i, h := range st.Source.Trace {
			if i > 0 {
				got += ","
			}
			got += h.Key + "=" + string(h.Value)
		}
		if got != want[st.Source.Offset] {
			t.Errorf("result of offset %d: trace %q, want %q", st.Source.Offset, got, want[st.Source.Offset])
		}
	}
}
