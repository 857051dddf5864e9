package gpupool

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the pool's Prometheus collectors (names fixed by
// docs/design.md). They always exist so the hot path needs no nil checks;
// they are registered only when a Registerer was given.
type metrics struct {
	pairsScored  prometheus.Counter
	batchRows    prometheus.Histogram
	batchTokens  prometheus.Histogram
	paddingRatio prometheus.Histogram
	queueDepth   prometheus.Gauge
	inference    *prometheus.HistogramVec
	gpuMemFree   *prometheus.GaugeVec
	gpuMemUsed   *prometheus.GaugeVec
	admission    *prometheus.CounterVec
	fallbacks    prometheus.Counter
	oomRetries   *prometheus.CounterVec
	gpuDegraded  *prometheus.GaugeVec
	devices      *prometheus.GaugeVec
	mode         *prometheus.GaugeVec
	gpuBusy      *prometheus.GaugeVec
}

func newMetrics(reg prometheus.Registerer, mode DeviceMode) (*metrics, error) {
	m := &metrics{
		pairsScored: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "scorer_pairs_scored_total", Help: "Sentence × hypothesis pairs scored.",
		}),
		batchRows: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "scorer_batch_rows", Help: "Pairs per inference batch.",
			Buckets: prometheus.ExponentialBuckets(1, 2, 10),
		}),
		batchTokens: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "scorer_batch_tokens", Help: "Padded tokens (rows × longest pair) per inference batch.",
			Buckets: prometheus.ExponentialBuckets(64, 2, 12),
		}),
		paddingRatio: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "scorer_batch_padding_ratio", Help: "Real tokens / padded tokens per inference batch (1 = no padding).",
			Buckets: []float64{0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95, 0.98, 1},
		}),
		queueDepth: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "scorer_queue_depth_pairs", Help: "Pairs queued for inference, not yet running.",
		}),
		inference: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "scorer_inference_seconds", Help: "Time of one inference batch on a device.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 15),
		}, []string{"device"}),
		gpuMemFree: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "scorer_gpu_memory_free_bytes", Help: "Free GPU memory at the last admission check.",
		}, []string{"device"}),
		gpuMemUsed: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "scorer_gpu_memory_used_bytes", Help: "Used GPU memory at the last admission check.",
		}, []string{"device"}),
		admission: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "scorer_admission_total", Help: "GPU admission decisions per batch.",
		}, []string{"device", "decision", "reason"}),
		fallbacks: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "scorer_fallbacks_total", Help: "Times a lazily created CPU engine took over because no GPU could run the work.",
		}),
		oomRetries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "scorer_oom_retries_total", Help: "Batches split and retried after running out of memory.",
		}, []string{"device"}),
		gpuDegraded: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "scorer_gpu_degraded", Help: "1 while a GPU is degraded (out of service, on probation until a re-probe passes), else 0.",
		}, []string{"device"}),
		devices: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "scorer_pool_devices", Help: "Engines the pool runs on, by kind (cuda, cpu); a lazily created CPU fallback included. No series until the first engine opens.",
		}, []string{"kind"}),
		mode: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "scorer_pool_device_mode", Help: "The DEVICE the pool was asked for (auto, cpu or cuda); always 1.",
		}, []string{"mode"}),
		gpuBusy: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "scorer_gpu_busy_ratio", Help: "Share of time a GPU ran a kernel (NVML utilization / 100), read every 250 ms; 1 - it is the GPU's idle time. No series on the CPU or where NVML cannot read it (MIG).",
		}, []string{"gpu"}),
	}
	m.mode.WithLabelValues(string(mode)).Set(1)
	if reg == nil {
		return m, nil
	}
	var errs []error
	for _, c := range []prometheus.Collector{m.pairsScored, m.batchRows, m.batchTokens, m.paddingRatio,
		m.queueDepth, m.inference, m.gpuMemFree, m.gpuMemUsed, m.admission, m.fallbacks, m.oomRetries, m.gpuDegraded, m.devices, m.mode, m.gpuBusy} {
		if err := reg.Register(c); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("gpupool: registering metrics: %w", errors.Join(errs...))
	}
	return m, nil
}

// deviceAdded counts a new engine of kind k in scorer_pool_devices. Both
// kinds' series appear with the first engine, so a pool on the CPU reads
// cuda=0 (what ScorerGPUFallback compares) rather than no series at all;
// before it, a pool still opening its GPUs reads nothing, not cuda=0.
func (m *metrics) deviceAdded(k DeviceKind) {
	for _, kind := range []DeviceKind{CUDA, CPU} {
		m.devices.WithLabelValues(kind.String()).Add(0)
	}
	m.devices.WithLabelValues(k.String()).Inc()
}
