package consumer

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics holds the consumer's collectors (names in docs/design.md). They
// exist even without a Registerer so the hot path never checks for nil.
type metrics struct {
	messagesIn *prometheus.CounterVec
	inflight   prometheus.GaugeFunc
	batchSize  prometheus.Histogram
	endToEnd   prometheus.Histogram
	commitTime prometheus.Histogram
	lag        *prometheus.GaugeVec
	dlq        *prometheus.CounterVec
	assigned   prometheus.Gauge
	dlqErrors  *prometheus.CounterVec
	outages    prometheus.Counter
	// committedLag, oldestUnacked, paused and commitErrors show a stuck
	// record that scorer_consumer_lag (measured from the fetched offset)
	// and liveness by progress alone do not.
	committedLag  *prometheus.GaugeVec
	oldestUnacked *prometheus.GaugeVec
	paused        *prometheus.GaugeVec
	commitErrors  prometheus.Counter
	tombstones    prometheus.Counter
	offsetResets  *prometheus.CounterVec
	// fetchErrors counts a partition's fetch failures, which readiness
	// does not follow: one failing partition must not flip /readyz.
	fetchErrors  *prometheus.CounterVec
	topicMissing prometheus.Gauge
	collections  []prometheus.Collector
}

// newMetrics builds the collectors and registers them on reg (nil: none).
// scorer_inflight_messages reads inflight at each scrape: a gauge set after
// each update of the count could end on an older update's value, since
// the count and the gauge would not change together.
func newMetrics(reg prometheus.Registerer, inflight func() float64) (*metrics, error) {
	m := &metrics{
		messagesIn: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "scorer_messages_in_total", Help: "Records fetched from the input topic.",
		}, []string{"topic"}),
		inflight: prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "scorer_inflight_messages", Help: "Records fetched but not yet acknowledged (published or dead-lettered).",
		}, inflight),
		batchSize: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "scorer_batch_messages", Help: "Records per scoring batch.",
			Buckets: []float64{1, 2, 4, 8, 16, 32, 64, 128, 256},
		}),
		endToEnd: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "scorer_end_to_end_seconds", Help: "Input record timestamp to output acknowledgement.",
			Buckets: prometheus.ExponentialBuckets(0.01, 2, 16),
		}),
		commitTime: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "scorer_commit_seconds", Help: "Duration of offset commits.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 14),
		}),
		lag: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "scorer_consumer_lag", Help: "High water mark minus fetched offset minus one, per assigned partition.",
		}, []string{"topic", "partition"}),
		dlq: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "scorer_dlq_total", Help: "Input records written to the dead-letter queue, by reason.",
		}, []string{"reason"}),
		assigned: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "scorer_assigned_partitions", Help: "Partitions assigned to this member in the current generation.",
		}),
		dlqErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "scorer_dlq_write_errors_total",
			Help: "Failed dead-letter writes, each retried (kind=transient, or permanent for records the sink rejected).",
		}, []string{"kind"}),
		outages: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "scorer_score_outage_retries_total",
			Help: "Rounds of backing off because the scorer failed for every event of a batch (events kept, not dead-lettered).",
		}),
		committedLag: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "scorer_committed_lag",
			Help: "Log end offset minus committed offset, per assigned partition: what a crash would replay plus what is unread.",
		}, []string{"topic", "partition"}),
		oldestUnacked: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "scorer_oldest_unacked_seconds",
			Help: "Age of the oldest fetched record not yet acknowledged (published or dead-lettered), per assigned partition; 0 when none.",
		}, []string{"topic", "partition"}),
		paused: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "scorer_partition_paused",
			Help: "1 while fetching of the partition is paused because its uncommitted span reached MAX_UNCOMMITTED.",
		}, []string{"topic", "partition"}),
		offsetResets: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "scorer_offset_resets_total",
			Help: "Read positions reset because they lay outside the partition's log (committed offset past the end, or retention passed it).",
		}, []string{"topic", "partition"}),
		tombstones: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "scorer_tombstones_total",
			Help: "Deletes (input tombstones and Debezium op=d events) forwarded as tombstones on the output topic.",
		}),
		fetchErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "scorer_fetch_errors_total",
			Help: "Fetches of an input partition that failed (retried with backoff; logged at warn level).",
		}, []string{"topic", "partition"}),
		commitErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "scorer_commit_errors_total", Help: "Offset commits that failed (retried by the next commit).",
		}),
		topicMissing: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "scorer_input_topic_missing",
			Help: "1 while the input topic does not exist (the member waits, with backoff, before each rejoin of the group).",
		}),
	}
	m.collections = []prometheus.Collector{m.messagesIn, m.inflight, m.batchSize, m.endToEnd, m.commitTime, m.lag, m.dlq, m.assigned,
		m.dlqErrors, m.outages, m.committedLag, m.oldestUnacked, m.paused, m.commitErrors, m.tombstones, m.offsetResets, m.fetchErrors, m.topicMissing}
	if reg == nil {
		return m, nil
	}
	var errs []error
	for _, c := range m.collections {
		if err := reg.Register(c); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("consumer: register metrics: %w", err)
	}
	return m, nil
}
