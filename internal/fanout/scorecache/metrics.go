package scorecache

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// metrics are the cache's collectors. They always exist, so the hot path
// needs no nil checks; they are registered only when a Registerer is given.
type metrics struct {
	hits, misses, evictions prometheus.Counter
	bytes                   prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		hits: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "scorer_score_cache_hits_total", Help: "Pairs answered from the score cache instead of inference.",
		}),
		misses: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "scorer_score_cache_misses_total", Help: "Pairs looked up in the score cache and not found.",
		}),
		evictions: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "scorer_score_cache_evictions_total", Help: "Score cache entries dropped to stay within SCORE_CACHE_BYTES.",
		}),
		bytes: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "scorer_score_cache_bytes", Help: "Memory of the score cache's table (at most SCORE_CACHE_BYTES).",
		}),
	}
	if reg == nil {
		return m, nil
	}
	var errs []error
	for _, c := range []prometheus.Collector{m.hits, m.misses, m.evictions, m.bytes} {
		if err := reg.Register(c); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("scorecache: registering metrics: %w", errors.Join(errs...))
	}
	return m, nil
}

// counterValue reads a counter back for Stats.
func counterValue(c prometheus.Counter) float64 {
	var d dto.Metric
	if err := c.Write(&d); err != nil {
		return 0
	}
	return d.GetCounter().GetValue()
}
