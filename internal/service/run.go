package service

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/segmentio/kafka-go"

	"github.com/scorer/scorer/consumer"
	"github.com/scorer/scorer/internal/broker"
	"github.com/scorer/scorer/internal/cli"
	"github.com/scorer/scorer/internal/config"
	"github.com/scorer/scorer/internal/produce"
	"github.com/scorer/scorer/internal/scoring"
	"github.com/scorer/scorer/producer"
)

// Command is `scorer run`: the streaming scorer. Start-up goes in
// dependency order (broker → model → pool → producer → consumer) and
// shutdown in reverse, under SHUTDOWN_TIMEOUT.
func Command(ctx context.Context, e cli.Env, args []string) error {
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	fs.SetOutput(e.Stderr)
	brokerAddr := fs.String("broker-addr", "127.0.0.1:9092", "listen address of the in-memory broker when KAFKA_BROKERS=embedded (falls back to a free port when taken)")
	demoFile := fs.String("demo-file", "", "after start-up, load this TranscriptEvent JSONL into the input topic and print a summary once all are handled (scored or dead-lettered)")
	demoLimit := fs.Int("demo-limit", 0, "load at most this many transcripts from --demo-file; 0 = all")
	cfg, err := config.Load(e.Getenv, fs, args)
	if err != nil {
		return cli.UsageOr(err)
	}
	embedded, err := embeddedBroker(cfg.KafkaBrokers)
	if err != nil {
		return err
	}
	log, err := cli.NewLogger(e.Stderr, cfg.LogLevel, cfg.LogFormat)
	if err != nil {
		return err
	}
	reg := newRegistry()
	h := newHealth(reg)
	embeddedGauge := prometheus.NewGauge(prometheus.GaugeOpts{Name: "scorer_embedded_broker",
		Help: "1 when this process consumes from and publishes to its own in-memory Kafka broker (KAFKA_BROKERS=embedded): nothing is durable and no other client sees it unless pointed at it."})
	reg.MustRegister(embeddedGauge)

	if cfg.MetricsAddr != "" && cfg.MetricsAddr != "off" {
		addr, stopHTTP, err := startHTTP(cfg.MetricsAddr, reg, h, log)
		if err != nil {
			return fmt.Errorf("metrics server: %w", err)
		}
		defer func() {
			sctx, cancel := context.WithTimeout(context.Background(), httpStopTimeout)
			defer cancel()
			_ = stopHTTP(sctx)
		}()
		log.Info().Str("addr", addr).Msg("serving /metrics, /healthz and /readyz")
	}

	if embedded {
		c, addr, err := broker.Start(broker.Options{Addr: *brokerAddr, Partitions: cfg.InputPartitions, MaxMessageBytes: 128 << 20})
		if err != nil {
			log.Warn().Err(err).Str("addr", *brokerAddr).Msg("in-memory broker address taken; using a free port")
			c, addr, err = broker.Start(broker.Options{Addr: "127.0.0.1:0", Partitions: cfg.InputPartitions, MaxMessageBytes: 128 << 20})
			if err != nil {
				return err
			}
		}
		defer c.Close()
		cfg.KafkaBrokers = []string{addr}
		embeddedGauge.Set(1)
		log.Warn().Str("addr", addr).
			Msgf("KAFKA_BROKERS=embedded: started an in-memory Kafka broker at %s; data is NOT durable and is lost at exit, and nothing outside this process reads or writes it unless pointed at it (kcat -b %s -L)", addr, addr)
	}
	sec, err := config.NewKafkaSecurity(&cfg)
	if err != nil {
		return err
	}

	// Topics that exist are left alone (no CREATE permission needed); the
	// missing ones get KAFKA_TOPIC_REPLICATION_FACTOR, 1 on the in-memory
	// broker, which has one node, and a max.message.bytes that fits the
	// largest record the input limits allow.
	rf := cfg.TopicReplication
	if embedded {
		rf = 1
	}
	prodCfg := cfg.ProducerConfig(sec)
	plan, err := planTopics(cfg, prodCfg, rf)
	if err != nil {
		return err
	}
	// The in-memory broker starts empty: its topics are always created.
	create := cfg.CreateTopics || embedded
	limits, err := PrepareTopicsRetry(ctx, cfg.KafkaBrokers, sec.Dialer(cfg.ClientID), create, plan.specs, log)
	if err != nil {
		if !create && errors.Is(err, kafka.UnknownTopicOrPartition) {
			err = fmt.Errorf("%w (KAFKA_CREATE_TOPICS=false: create them, or let the scorer create them with KAFKA_CREATE_TOPICS=true)", err)
		}
		return stoppedDuringStartup(ctx, err, log)
	}
	if err := checkTopicLimits(cfg, prodCfg, plan, limits, log); err != nil {
		return err
	}
	prodCfg.TopicMaxBytes = map[string]int64{cfg.OutputTopic: limits[cfg.OutputTopic], cfg.DLQTopic: limits[cfg.DLQTopic]}
	if cfg.RowsTopic != "" {
		prodCfg.TopicMaxBytes[cfg.RowsTopic] = limits[cfg.RowsTopic]
	}

	stack, err := scoring.Open(ctx, cfg, log, reg)
	if err != nil {
		return stoppedDuringStartup(ctx, err, log)
	}
	h.modelLoaded.Store(true)
	reg.MustRegister(buildInfo(stack))

	prod, err := producer.New(prodCfg, log.With().Str("component", "producer").Logger(), reg)
	if err != nil {
		stack.Close(context.Background())
		return err
	}

	cons, err := consumer.New(cfg.ConsumerConfig(sec), stack.Scorer, prod, log, reg)
	if err != nil {
		closeWithin(cfg.ShutdownTimeout, log, prod.Close, stack.Close)
		return err
	}
	ready := cons.Ready
	h.consumerReady.Store(&ready)
	if cfg.LivenessStallTimeout > 0 {
		h.progress.Store(&progressWatch{limit: cfg.LivenessStallTimeout, now: time.Now,
			sample: func() (uint64, bool) {
				cs, ps := cons.Stats(), stack.Pool.Stats()
				return cs.Published + cs.DeadLettered + ps.Batches, cs.Inflight > 0
			},
			stuck: func() (time.Duration, string) {
				return oldestStuck(stack.Pool.Stats().OldestRun, cons.OldestAcknowledgement())
			}})
	}

	if *demoFile != "" {
		go produce.RunDemo(ctx, *demoFile, *demoLimit, cfg, sec, e.Stdout, stack, log)
	}

	log.Info().Str("input", cfg.InputTopic).Str("output", cfg.OutputTopic).Str("dlq", cfg.DLQTopic).
		Str("group", cfg.GroupID).Str("model", stack.Model.Name).Str("model_sha256", stack.Model.SHA256).
		Msg("scorer running; SIGTERM or Ctrl-C to stop")
	// Readiness drops the moment the signal arrives, not after the drain,
	// and the whole shutdown shares one SHUTDOWN_TIMEOUT budget.
	var stopAt atomic.Int64
	stopReadiness := context.AfterFunc(ctx, func() {
		stopAt.Store(time.Now().UnixNano())
		h.shuttingDown.Store(true)
		log.Info().Dur("timeout", cfg.ShutdownTimeout).Msg("shutting down: fetching stopped, draining in-flight work")
	})
	defer stopReadiness()
	runErr := cons.Run(ctx)
	h.shuttingDown.Store(true)
	remaining := cfg.ShutdownTimeout
	if t := stopAt.Load(); t != 0 {
		remaining -= time.Since(time.Unix(0, t))
	}
	log.Info().Dur("remaining", remaining).Msg("consumer stopped; closing producer and scoring pool")
	// The consumer keeps part of SHUTDOWN_TIMEOUT back from its drain, so
	// this normally runs within the budget; the floor lets a stop that used
	// it all still flush and release the GPU. Worst case (runs that ignore
	// cancellation) the process exits SHUTDOWN_TIMEOUT + closeFloor + the
	// pool's 5 s close grace + httpStopTimeout (+ the consumer's 0.5 s)
	// after SIGTERM, inside the Helm chart's grace period of
	// SHUTDOWN_TIMEOUT + 15 s.
	closeWithin(max(remaining, closeFloor), log, prod.Close, stack.Close)
	if runErr != nil && !errors.Is(runErr, context.Canceled) {
		return runErr
	}
	log.Info().Msg("scorer stopped cleanly")
	return nil
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

// stoppedDuringStartup turns a start-up failure caused by SIGTERM or Ctrl-C
// (ctx cancelled, e.g. while waiting for the broker) into a clean stop, exit
// 0 as for any other stop; other failures pass through.
func stoppedDuringStartup(ctx context.Context, err error, log zerolog.Logger) error {
	if ctx.Err() == nil {
		return err
	}
	log.Info().AnErr("cause", err).Msg("stopped before start-up finished")
	return nil
}

// Fixed margins of the shutdown past SHUTDOWN_TIMEOUT (see Run).
const (
	closeFloor      = 2 * time.Second
	httpStopTimeout = time.Second
)

// closeWithin closes components in order under one deadline, logging
// overruns: a stuck Close (kafka-go can hang when brokers are gone) must not
// keep the process from exiting.
func closeWithin(d time.Duration, log zerolog.Logger, closers ...func(context.Context) error) {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	for _, c := range closers {
		if err := c(ctx); err != nil {
			log.Warn().Err(err).Msg("close")
		}
	}
}

// EnsureTopicsRetry creates missing topics as PrepareTopicsRetry does,
// discarding their limits.
func EnsureTopicsRetry(ctx context.Context, brokers []string, d *kafka.Dialer, topics []producer.TopicSpec, log zerolog.Logger) error {
	_, err := PrepareTopicsRetry(ctx, brokers, d, true, topics, log)
	return err
}

// PrepareTopicsRetry readies the topics with producer.PrepareTopics
// (creating the missing ones when create is set) and returns their
// max.message.bytes. It retries with backoff what may heal (no broker
// reachable yet, a leader or controller not available, a timeout), so that
// a broker that starts after the scorer is waited for, with a clear log line
// each time, and returns at once what will not (an invalid replication
// factor, missing permissions, a failed authentication, a missing topic
// with creation off): retrying those would only hide them.
func PrepareTopicsRetry(ctx context.Context, brokers []string, d *kafka.Dialer, create bool, topics []producer.TopicSpec, log zerolog.Logger) (map[string]int64, error) {
	backoff := 500 * time.Millisecond
	for attempt := 1; ; attempt++ {
		limits, err := producer.PrepareTopics(ctx, brokers, d, create, topics...)
		if err == nil {
			return limits, nil
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("waiting for Kafka: %w", ctx.Err())
		}
		if consumer.IsPermanent(err) {
			return nil, fmt.Errorf("kafka: topics cannot be set up, and retrying will not help: %w", err)
		}
		log.Warn().Err(err).Strs("brokers", brokers).Int("attempt", attempt).Dur("retry_in", backoff).
			Msg("Kafka not reachable yet; retrying")
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("waiting for Kafka: %w", ctx.Err())
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 15*time.Second)
	}
}

func buildInfo(s *scoring.Stack) prometheus.Collector {
	g := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "scorer_build_info", Help: "Build and model identity; always 1."}, []string{"version", "model", "model_sha256"})
	g.WithLabelValues(cli.Version(), s.Model.Name, s.Model.SHA256).Set(1)
	return g
}
