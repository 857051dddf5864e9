package service

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/rs/zerolog"
)

// health is what /readyz reports: each check must hold for the pod to take
// traffic. Readiness turns false the moment shutdown begins, so the
// orchestrator stops counting on this member before it drains. The
// scorer_ready gauge evaluates the same checks at every scrape, so /metrics
// never shows a value left over from the last /readyz call.
type health struct {
	modelLoaded  atomic.Bool
	shuttingDown atomic.Bool
	// consumerReady reports broker reachable and group joined (an
	// assignment received, possibly empty); nil until the consumer exists.
	consumerReady atomic.Pointer[func() bool]
	// progress fails /healthz when the pipeline is wedged; nil until the
	// pipeline exists, or when LIVENESS_STALL_TIMEOUT is 0.
	progress atomic.Pointer[progressWatch]
	// modelChanged fails /healthz for good once the model's files no longer
	// hold the bytes that were loaded (watchModelFiles); nil until then.
	modelChanged atomic.Pointer[error]
}

func newHealth(reg prometheus.Registerer) *health {
	h := &health{}
	if reg != nil {
		reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "scorer_ready", Help: "1 when the model is loaded, the broker reachable and the consumer group joined.",
		}, func() float64 {
			if _, ok := h.checks(); ok {
				return 1
			}
			return 0
		}))
	}
	return h
}

// checks evaluates readiness, naming each check.
func (h *health) checks() (map[string]bool, bool) {
	c := map[string]bool{
		"model_loaded":   h.modelLoaded.Load(),
		"not_stopping":   !h.shuttingDown.Load(),
		"consumer_ready": false,
	}
	if f := h.consumerReady.Load(); f != nil {
		c["consumer_ready"] = (*f)()
	}
	ok := true
	for _, v := range c {
		ok = ok && v
	}
	return c, ok
}

// newRegistry is the process's metric registry: Go runtime and process
// collectors plus whatever the components register.
func newRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

// startHTTP serves /metrics, /healthz and /readyz. It returns the bound
// address (useful with port 0) and a shutdown func.
func startHTTP(addr string, reg *prometheus.Registry, h *health, log zerolog.Logger) (string, func(context.Context) error, error) {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		if err := h.modelChanged.Load(); err != nil {
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = fmt.Fprintf(w, "model files changed: %v\n", *err)
			return
		}
		// A drain is bounded by SHUTDOWN_TIMEOUT already; only a running
		// pipeline can be wedged.
		if pw := h.progress.Load(); pw != nil && !h.shuttingDown.Load() {
			if stalled, since, why := pw.stalled(); stalled {
				log.Error().Dur("for", since).Dur("limit", pw.limit).Str("why", why).
					Msg("liveness failing: no inference, publish or dead letter with records in flight, or one inference run or one record's publish or dead letter going on for too long")
				w.WriteHeader(http.StatusServiceUnavailable)
				_, _ = fmt.Fprintf(w, "stalled: %s for %s (limit %s)\n", why, since.Round(time.Second), pw.limit)
				return
			}
		}
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		c, ok := h.checks()
		w.Header().Set("Content-Type", "application/json")
		if !ok {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		_ = json.NewEncoder(w).Encode(map[string]any{"ready": ok, "checks": c})
	})
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", nil, err
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error().Err(err).Msg("metrics server stopped")
		}
	}()
	return ln.Addr().String(), srv.Shutdown, nil
}
