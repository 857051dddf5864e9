package service

import (
	"context"
	"errors"
	"flag"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/scorer/scorer/consumer"
	"github.com/scorer/scorer/internal/cli"
	"github.com/scorer/scorer/internal/config"
	"github.com/scorer/scorer/internal/scoring"
	"github.com/scorer/scorer/internal/streaming"
	"github.com/scorer/scorer/producer"
)

// Spec is `scorer run` for its help and the docs.
var Spec = cli.Spec{
	Name: "run", Synopsis: "[flags]",
	Summary: "consume TranscriptEvents, score them, publish ScoredTranscripts",
	About: "The streaming scorer: consume TranscriptEvents from KAFKA_INPUT_TOPIC, score every sentence against " +
		"every label, publish ScoredTranscripts to KAFKA_OUTPUT_TOPIC (optional rows, dead letters to KAFKA_DLQ_TOPIC) " +
		"and commit an input offset only once its output was acknowledged. KAFKA_BROKERS is required; " +
		"KAFKA_BROKERS=embedded starts an in-memory broker in this process (not durable). Serves /metrics, " +
		"/healthz and /readyz at METRICS_ADDR; SIGTERM drains and exits 0.",
	Settings: config.Run,
	Flags:    func(fs *flag.FlagSet) { new(runFlags).register(fs) },
}

// Command is `scorer run`: the streaming scorer. It starts one component
// after another in dependency order (HTTP, the in-memory broker, the Kafka
// topics, the scoring stack, producer, consumer, the demo: the start steps
// in steps.go), serves until ctx ends, and closes them in reverse under
// SHUTDOWN_TIMEOUT.
func Command(ctx context.Context, e cli.Env, args []string) error {
	fs := Spec.FlagSet(e)
	var f runFlags
	f.register(fs)
	cfg, err := Spec.Load(e, fs, args)
	if err != nil {
		return err
	}
	embedded, err := embeddedBroker(cfg.KafkaBrokers)
	if err != nil {
		return err
	}
	log, err := cli.NewLogger(e.Stderr, cfg.LogLevel, cfg.LogFormat)
	if err != nil {
		return err
	}
	r := &runner{e: e, flags: f, cfg: cfg, embedded: embedded, log: log, reg: newRegistry()}
	r.health = newHealth(r.reg)
	for _, step := range []func(context.Context) error{
		r.startHTTP, r.startBroker, r.prepareTopics, r.openScoring, r.watchModelFiles, r.startProducer, r.startConsumer, r.startDemo,
	} {
		if err := step(ctx); err != nil {
			r.close(r.cfg.ShutdownTimeout)
			return stoppedDuringStartup(ctx, err, log)
		}
	}
	return r.serve(ctx)
}

// runFlags are `scorer run`'s own flags.
type runFlags struct {
	brokerAddr string
	demoFile   string
	demoLimit  int
}

func (f *runFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.brokerAddr, "broker-addr", "127.0.0.1:9092", "listen address of the in-memory broker when KAFKA_BROKERS=embedded (falls back to a free port when taken)")
	fs.StringVar(&f.demoFile, "demo-file", "", "after start-up, load this TranscriptEvent JSONL into the input topic and print a summary once all are handled (scored or dead-lettered); make run uses it")
	fs.IntVar(&f.demoLimit, "demo-limit", 0, "load at most this many transcripts from --demo-file; 0 = all")
}

// runner is `scorer run` from start to stop: what each start step made,
// and the closers of what is open, which close runs in reverse.
type runner struct {
	e        cli.Env
	flags    runFlags
	cfg      config.Config // with KafkaBrokers at the in-memory broker when embedded
	embedded bool
	log      zerolog.Logger
	reg      *prometheus.Registry
	health   *health
	topics   streaming.Topics
	stack    *scoring.Stack
	prod     *producer.Producer
	cons     *consumer.Consumer
	closers  []func(context.Context) error
}

// serve runs the consumer until ctx ends, then closes everything in
// reverse. Readiness drops the moment the signal arrives, not after the
// drain, and the whole shutdown shares one SHUTDOWN_TIMEOUT budget.
func (r *runner) serve(ctx context.Context) error {
	r.log.Info().Str("input", r.cfg.InputTopic).Str("output", r.cfg.OutputTopic).Str("dlq", r.cfg.DLQTopic).
		Str("group", r.cfg.GroupID).Str("model", r.stack.Model.Name).Str("model_sha256", r.stack.Model.SHA256).
		Msg("scorer running; SIGTERM or Ctrl-C to stop")
	var stopAt atomic.Int64
	stopReadiness := context.AfterFunc(ctx, func() {
		stopAt.Store(time.Now().UnixNano())
		r.health.shuttingDown.Store(true)
		r.log.Info().Dur("timeout", r.cfg.ShutdownTimeout).Msg("shutting down: fetching stopped, draining in-flight work")
	})
	defer stopReadiness()
	runErr := r.cons.Run(ctx)
	r.health.shuttingDown.Store(true)
	remaining := r.cfg.ShutdownTimeout
	if t := stopAt.Load(); t != 0 {
		remaining -= time.Since(time.Unix(0, t))
	}
	r.log.Info().Dur("remaining", remaining).Msg("consumer stopped; closing producer and scoring pool")
	// The consumer keeps part of SHUTDOWN_TIMEOUT back from its drain, so
	// this normally runs within the budget; the floor lets a stop that used
	// it all still flush and release the GPU. Worst case (runs that ignore
	// cancellation) the process exits SHUTDOWN_TIMEOUT + closeFloor + the
	// pool's 5 s close grace + httpStopTimeout (+ the consumer's 0.5 s)
	// after SIGTERM, inside the Helm chart's grace period of
	// SHUTDOWN_TIMEOUT + 15 s.
	r.close(max(remaining, closeFloor))
	if runErr != nil && !errors.Is(runErr, context.Canceled) {
		return runErr
	}
	r.log.Info().Msg("scorer stopped cleanly")
	return nil
}

// onClose adds a closer; close runs it before those added earlier.
func (r *runner) onClose(c func(context.Context) error) { r.closers = append(r.closers, c) }

// close runs the closers in reverse order of start under one deadline,
// logging failures and overruns: a stuck Close (kafka-go can hang when
// brokers are gone) must not keep the process from exiting.
func (r *runner) close(d time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	for i := len(r.closers) - 1; i >= 0; i-- {
		if err := r.closers[i](ctx); err != nil {
			r.log.Warn().Err(err).Msg("close")
		}
	}
	r.closers = nil
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

// Fixed margins of the shutdown past SHUTDOWN_TIMEOUT (see serve).
const (
	closeFloor      = 2 * time.Second
	httpStopTimeout = time.Second
)
