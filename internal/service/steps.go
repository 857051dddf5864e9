package service

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/scorer/scorer/internal/broker"
	"github.com/scorer/scorer/internal/cli"
	"github.com/scorer/scorer/internal/produce"
	"github.com/scorer/scorer/internal/scoring"
	"github.com/scorer/scorer/internal/streaming"
)

// The start steps of `scorer run`, in the order Command runs them. Each
// starts one component from the configuration and what the steps before it
// made, and registers its closer; a step that fails returns its error and
// Command closes what is open.

// startHTTP serves /metrics, /healthz and /readyz at METRICS_ADDR (none for
// "off"). The server stops last, so probes and a final scrape still answer
// while the rest closes.
func (r *runner) startHTTP(context.Context) error {
	if r.cfg.MetricsAddr == "" || r.cfg.MetricsAddr == "off" {
		return nil
	}
	addr, stop, err := startHTTP(r.cfg.MetricsAddr, r.reg, r.health, r.log)
	if err != nil {
		return fmt.Errorf("metrics server: %w", err)
	}
	r.onClose(func(context.Context) error {
		sctx, cancel := context.WithTimeout(context.Background(), httpStopTimeout)
		defer cancel()
		_ = stop(sctx)
		return nil
	})
	r.log.Info().Str("addr", addr).Msg("serving /metrics, /healthz and /readyz")
	return nil
}

// startBroker starts the in-memory broker for KAFKA_BROKERS=embedded, at
// --broker-addr or, when that is taken, a free port, and points the
// configuration at it; scorer_embedded_broker says which.
func (r *runner) startBroker(context.Context) error {
	gauge := prometheus.NewGauge(prometheus.GaugeOpts{Name: "scorer_embedded_broker",
		Help: "1 when this process consumes from and publishes to its own in-memory Kafka broker (KAFKA_BROKERS=embedded): nothing is durable and no other client sees it unless pointed at it."})
	r.reg.MustRegister(gauge)
	if !r.embedded {
		return nil
	}
	opts := broker.Options{Addr: r.flags.brokerAddr, Partitions: r.cfg.InputPartitions, MaxMessageBytes: 128 << 20}
	c, addr, err := broker.Start(opts)
	if err != nil {
		r.log.Warn().Err(err).Str("addr", opts.Addr).Msg("in-memory broker address taken; using a free port")
		opts.Addr = "127.0.0.1:0"
		if c, addr, err = broker.Start(opts); err != nil {
			return err
		}
	}
	r.onClose(func(context.Context) error { c.Close(); return nil })
	r.cfg.KafkaBrokers = []string{addr}
	gauge.Set(1)
	r.log.Warn().Str("addr", addr).
		Msgf("KAFKA_BROKERS=embedded: started an in-memory Kafka broker at %s; data is NOT durable and is lost at exit, and nothing outside this process reads or writes it unless pointed at it (kcat -b %s -L)", addr, addr)
	return nil
}

// prepareTopics readies and sizes the topics (streaming.Prepare): the
// in-memory broker's are always created, with replication factor 1.
func (r *runner) prepareTopics(ctx context.Context) error {
	t, err := streaming.Prepare(ctx, r.cfg, r.embedded, r.log)
	if err != nil {
		return err
	}
	r.topics = t
	return nil
}

// openScoring opens the scoring stack (ONNX Runtime, model, NVML, pool,
// cache, transcript scorer): from here the model counts as loaded for
// /readyz, and scorer_build_info names it.
func (r *runner) openScoring(ctx context.Context) error {
	stack, err := scoring.Open(ctx, r.cfg, r.log, r.reg)
	if err != nil {
		return err
	}
	r.stack = stack
	r.onClose(stack.Close)
	r.health.modelLoaded.Store(true)
	r.reg.MustRegister(buildInfo(stack))
	return nil
}

// startProducer opens the producer of results, rows and dead letters.
func (r *runner) startProducer(context.Context) error {
	prod, err := streaming.NewProducer(r.topics, r.log, r.reg)
	if err != nil {
		return err
	}
	r.prod = prod
	r.onClose(prod.Close)
	return nil
}

// startConsumer builds the consumer, which serve runs, and wires readiness
// and liveness to it: /readyz waits for the group; /healthz fails when the
// pipeline stalls with records in flight, or one record or one inference
// run is stuck, for LIVENESS_STALL_TIMEOUT (0: never).
func (r *runner) startConsumer(context.Context) error {
	cons, err := streaming.NewConsumer(r.cfg, r.topics, r.stack.Scorer, r.prod, r.log, r.reg)
	if err != nil {
		return err
	}
	r.cons = cons
	ready := cons.Ready
	r.health.consumerReady.Store(&ready)
	if r.cfg.LivenessStallTimeout > 0 {
		pool, scorer := r.stack.Pool, r.stack.Scorer
		r.health.progress.Store(&progressWatch{limit: r.cfg.LivenessStallTimeout, now: time.Now,
			sample: func() (uint64, bool) {
				cs, ps := cons.Stats(), pool.Stats()
				return cs.Published + cs.DeadLettered + ps.Batches + scorer.Encoded(), cs.Inflight > 0
			},
			stuck: func() (time.Duration, string) {
				return oldestStuck(pool.Stats().OldestRun, cons.OldestAcknowledgement())
			}})
	}
	return nil
}

// startDemo loads --demo-file into the input topic in the background and
// prints a summary once every record is handled (make run).
func (r *runner) startDemo(ctx context.Context) error {
	if r.flags.demoFile != "" {
		go produce.RunDemo(ctx, r.flags.demoFile, r.flags.demoLimit, r.cfg, r.topics.Security, r.e.Stdout, r.stack, r.log)
	}
	return nil
}

// buildInfo is scorer_build_info: the binary's version and the model's
// name and hash, always 1.
func buildInfo(s *scoring.Stack) prometheus.Collector {
	g := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "scorer_build_info", Help: "Build and model identity; always 1."}, []string{"version", "model", "model_sha256"})
	g.WithLabelValues(cli.Version(), s.Model.Name, s.Model.SHA256).Set(1)
	return g
}

// EmbeddedBrokers is the KAFKA_BROKERS value that makes `scorer run` start
// an in-memory broker in its own process (development and `make run`).
const EmbeddedBrokers = "embedded"

// embeddedBroker reads KAFKA_BROKERS for `scorer run`: true for
// EmbeddedBrokers alone, false for broker addresses, and an error naming the
// variable when it is empty (unset, or only commas and spaces) or mixes the
// two. An empty value is not taken to mean the in-memory broker: a missing
// secret or a typo in a deployment would then start a scorer that reports
// ready and consumes nothing real.
func embeddedBroker(brokers []string) (bool, error) {
	const fix = "set it to the bootstrap brokers (host:port,…), or to " + EmbeddedBrokers + " for an in-memory broker in this process (not durable; for demos and development)"
	n := 0
	for _, b := range brokers {
		if strings.EqualFold(b, EmbeddedBrokers) {
			n++
		}
	}
	switch {
	case len(brokers) == 0:
		return false, fmt.Errorf("config: KAFKA_BROKERS is empty: %s", fix)
	case n > 0 && len(brokers) > 1:
		return false, fmt.Errorf("config: KAFKA_BROKERS=%s mixes %s with broker addresses: %s", strings.Join(brokers, ","), EmbeddedBrokers, fix)
	}
	return n == 1, nil
}
