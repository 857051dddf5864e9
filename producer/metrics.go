package producer

import (
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the producer's collectors (names fixed by docs/design.md).
type metrics struct {
	out     *prometheus.CounterVec
	seconds prometheus.Histogram
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		out: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "scorer_messages_out_total",
			Help: "Records acknowledged by the broker, by topic and kind (result, row, dlq, tombstone).",
		}, []string{"topic", "kind"}),
		seconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "scorer_produce_seconds",
			Help:    "Duration of one synchronous kafka-go WriteMessages call (until acks=all).",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 14),
		}),
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.out, m.seconds} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("producer: register metrics: %w", err)
		}
	}
	return m, nil
}

func (m *metrics) observe(d time.Duration) { m.seconds.Observe(d.Seconds()) }

func (m *metrics) count(msgs []outMsg) {
	for _, o := range msgs {
		m.out.WithLabelValues(o.msg.Topic, o.kind).Inc()
	}
}
