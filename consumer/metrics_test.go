package consumer

import (
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
)

// TestInflightGaugeMatchesCount: scorer_inflight_messages reads what the
// in-flight count is, however updates from several goroutines interleave.
// Updates that added to the count and then set the gauge to their result
// could leave a later result overwritten by an earlier one: 1 on an idle
// consumer.
func TestInflightGaugeMatchesCount(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	c, err := New(testConfig([]string{"127.0.0.1:1"}, "t", "g"), &fakeScorer{}, &fakeSink{}, zerolog.Nop(), reg)
	if err != nil {
		t.Fatal(err)
	}
	const rounds, workers, each = 2000, 4, 50
	for r := range rounds {
		var wg sync.WaitGroup
		begin := make(chan struct{})
		for range workers {
			wg.Go(func() {
				<-begin
				for range each {
					c.addInflight(1)
					c.addInflight(-1)
				}
			})
		}
		close(begin)
		wg.Wait()
		if v, _ := gaugeOf(t, reg, "scorer_inflight_messages", -1); v != 0 {
			t.Fatalf("round %d: scorer_inflight_messages = %v with nothing in flight (count %d)", r, v, c.Stats().Inflight)
		}
	}
}
