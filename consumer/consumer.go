// Package consumer reads TranscriptEvents from a Kafka consumer group,
// scores them in bounded batches and publishes the results at least once:
// an input offset is committed only after its result (or dead letter) was
// acknowledged, out-of-order completion never commits past a gap, and a
// partition revoked in a rebalance is never committed again by this member.
package consumer

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/segmentio/kafka-go"

	"github.com/scorer/scorer/schema"
)

// Scorer scores a batch of events, one result per event in input order.
// It must return promptly once ctx ends. gpupool/model satisfy it.
type Scorer interface {
	Score(ctx context.Context, events []schema.TranscriptEvent) ([]schema.ScoredTranscript, error)
}

// Sink writes results and dead letters and returns only after the broker
// acknowledged them, because the consumer commits offsets on that return.
// An error satisfying IsPermanent means retrying cannot help. producer
// satisfies it.
type Sink interface {
	Publish(ctx context.Context, results []schema.ScoredTranscript) error
	DeadLetter(ctx context.Context, dls []schema.DeadLetter) error
}

// Stats is a snapshot of the consumer's counters, for tests and debugging.
type Stats struct {
	MessagesIn   uint64 // records fetched
	Published    uint64 // results acknowledged by the sink
	DeadLettered uint64 // records acknowledged by the DLQ
	Inflight     int64  // fetched, not yet acknowledged nor abandoned
	InflightPeak int64  // highest Inflight seen
	Commits      uint64 // successful offset commits
	CommitErrors uint64
	// Pauses counts times a partition's fetching paused because its
	// uncommitted span reached MaxUncommitted.
	Pauses uint64
	// Expulsions counts generations abandoned because the coordinator said
	// this member was no longer in them.
	Expulsions uint64
	// OffsetResets counts read positions reset because they lay outside
	// the partition's log.
	OffsetResets uint64
	// OldestUnacked is the age of the oldest fetched record not yet
	// acknowledged, over the current generation's partitions (0: none).
	OldestUnacked time.Duration
	// OldestAcknowledgement is how long the longest acknowledgement going
	// on has run (0: none); see Consumer.OldestAcknowledgement.
	OldestAcknowledgement time.Duration
	Generations           uint64 // group generations joined
	Assigned              int    // partitions in the current generation
	// Batches counts flushed batches by the rule that ended them
	// (Trigger.String()).
	Batches map[string]uint64
}

// Consumer is one member of the consumer group. Create it with New and call
// Run once; Ready and Stats are safe to call concurrently with Run.
type Consumer struct {
	cfg  Config
	log  zerolog.Logger
	m    *metrics
	proc *processor
	pipe *pipeline

	// cur is the current generation, for OldestUnacked; nil between
	// generations.
	cur atomic.Pointer[genState]

	// drainLimit is the part of ShutdownTimeout the drain may use (see
	// Config.shutdownBudget).
	drainLimit time.Duration
	// fetchers counts partition fetch goroutines, reader close included;
	// Run waits for them (bounded) before it returns.
	fetchers sync.WaitGroup
	running  atomic.Bool
	assigned atomic.Int32
	// member is true while this consumer holds a generation of the group,
	// whether or not it got partitions.
	member   atomic.Bool
	brokerOK atomic.Bool
	// topicMissing is true from a look that found the input topic gone
	// until it is found again; missingStep is the backoff of the last
	// rejoin held back meanwhile (see holdIfTopicMissing).
	topicMissing atomic.Bool
	missingStep  atomic.Int64

	messagesIn                         atomic.Uint64
	inflight, inflightPeak             atomic.Int64
	commits, commitErrors, generations atomic.Uint64
	pauses, expulsions, offsetResets   atomic.Uint64

	// hooks lets tests observe internals; zero in production.
	hooks testHooks
}

// testHooks are called, when set, at points tests need to observe.
type testHooks struct {
	assigned func(generation int32, memberID string, partitions []int)
	// starting runs right before the generation's work is started with
	// gen.Start.
	starting func(generation int32)
	// draining runs when a generation's end starts waiting for its work
	// in flight; why is rebalance or shutdown.
	draining func(generation int32, why string)
}

// record is one fetched message on its way through the pipeline.
type record struct {
	msg  kafka.Message
	gen  *genState
	ps   *partState
	done func() // resolves the offset in its partition's watermark
	// settled guards the inflight accounting against double counting.
	settled atomic.Bool
}

// New checks cfg (after applying defaults) and registers metrics on reg
// (nil: none). It opens no connection; Run does.
func New(cfg Config, scorer Scorer, sink Sink, log zerolog.Logger, reg prometheus.Registerer) (*Consumer, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if scorer == nil || sink == nil {
		return nil, errors.New("consumer: scorer and sink are required")
	}
	c := &Consumer{cfg: cfg, log: log.With().Str("component", "consumer").Str("topic", cfg.Topic).Logger()}
	m, err := newMetrics(reg, func() float64 { return float64(c.inflight.Load()) })
	if err != nil {
		return nil, err
	}
	c.m = m
	c.proc = &processor{cfg: cfg, scorer: scorer, sink: sink, log: c.log, m: m, settle: c.settle}
	c.pipe = newPipeline(cfg, m, c.proc, c.settle)
	var clamped bool
	c.drainLimit, clamped = cfg.shutdownBudget()
	if clamped {
		c.log.Warn().Dur("shutdown_timeout", cfg.ShutdownTimeout).Dur("session_timeout", cfg.SessionTimeout).
			Dur("heartbeat_interval", cfg.HeartbeatInterval).Dur("drain_limit", c.drainLimit).
			Msg("shutdown drain capped at session timeout minus heartbeat interval, so the final commit is not rejected")
	}
	return c, nil
}

// Ready reports whether this consumer is a member of the group (it has
// received its assignment) and its last broker interaction succeeded, for
// /readyz. A member given no partitions (more members than partitions, as
// during a rolling update's surge) is ready but idle: were it not ready, a
// rollout whose new pod drew the empty share could never finish, and idle
// pods would block node drains under a PodDisruptionBudget.
// scorer_assigned_partitions shows idle members. A member whose input
// topic does not exist is not ready: it can do nothing until the topic is
// back, and a rollout with a mistyped KAFKA_TOPIC stops at its first pod
// instead of replacing members that work.
func (c *Consumer) Ready() bool {
	return c.member.Load() && c.brokerOK.Load() && !c.topicMissing.Load()
}

// Stats returns a snapshot of the counters.
func (c *Consumer) Stats() Stats {
	s := Stats{
		MessagesIn: c.messagesIn.Load(), Published: c.proc.published.Load(),
		DeadLettered: c.proc.deadLettered.Load(), Inflight: c.inflight.Load(),
		InflightPeak: c.inflightPeak.Load(), Commits: c.commits.Load(),
		CommitErrors: c.commitErrors.Load(), Generations: c.generations.Load(),
		Assigned: int(c.assigned.Load()), Batches: map[string]uint64{},
		Pauses: c.pauses.Load(), Expulsions: c.expulsions.Load(), OffsetResets: c.offsetResets.Load(), OldestUnacked: c.OldestUnacked(),
		OldestAcknowledgement: c.OldestAcknowledgement(),
	}
	for t := range c.pipe.batches {
		if n := c.pipe.batches[t].Load(); n > 0 {
			s.Batches[Trigger(t).String()] = n
		}
	}
	return s
}

// OldestUnacked returns the age of the oldest record fetched in the current
// generation and not yet acknowledged (0 when none), so liveness can fail
// when one record is stuck even while other work progresses.
func (c *Consumer) OldestUnacked() time.Duration {
	g := c.cur.Load()
	if g == nil {
		return 0
	}
	var oldest time.Duration
	for _, ps := range g.parts {
		if at, ok := ps.wm.Oldest(); ok {
			oldest = max(oldest, time.Since(at))
		}
	}
	return oldest
}

// OldestAcknowledgement returns how long the longest acknowledgement going
// on now has run (0 when none): a batch's results and dead letters being
// written, and retried, once its turn came. It grows only for a record
// that is scored (or failed to decode) and cannot be written: a dead
// letter the DLQ refuses, a publish that keeps failing. Scoring does not
// count, however long the transcript (the pool's progress shows that work
// moving), nor does waiting for an earlier batch of the partition (which
// counts itself), so liveness can tell a stuck record from a long one.
func (c *Consumer) OldestAcknowledgement() time.Duration {
	return c.pipe.oldestAcknowledgement()
}

// Run joins the group and processes records until ctx ends. On ctx end it
// stops fetching, waits for in-flight work, commits what is done and leaves
// the group, all within ShutdownTimeout of ctx's end (see
// Config.ShutdownTimeout), and returns nil. It returns an error only if the
// group cannot be set up at all. Run may be called once.
func (c *Consumer) Run(ctx context.Context) error {
	if !c.running.CompareAndSwap(false, true) {
		return errors.New("consumer: Run called twice")
	}
	leave := &groupCloser{done: make(chan struct{}), stopping: make(chan struct{}), brokers: len(c.cfg.Brokers)}
	cg, err := kafka.NewConsumerGroup(kafka.ConsumerGroupConfig{
		ID:                c.cfg.GroupID,
		Brokers:           c.cfg.Brokers,
		Dialer:            leave.dialer(c.cfg.kafkaDialer()),
		Topics:            []string{c.cfg.Topic},
		HeartbeatInterval: c.cfg.HeartbeatInterval,
		SessionTimeout:    c.cfg.SessionTimeout,
		RebalanceTimeout:  c.cfg.RebalanceTimeout,
		JoinGroupBackoff:  c.cfg.JoinGroupBackoff,
		StartOffset:       c.cfg.StartOffset,
		Timeout:           10 * time.Second,
		// Without it, partitions added to the input topic are not read
		// until some unrelated membership change.
		WatchPartitionChanges:  true,
		PartitionWatchInterval: c.cfg.PartitionWatchInterval,
		ErrorLogger:            kafka.LoggerFunc(func(f string, a ...any) { c.log.Debug().Msgf("kafka-go: "+f, a...) }),
	})
	if err != nil {
		return fmt.Errorf("consumer: consumer group: %w", err)
	}
	leave.cg = cg
	stop := &stopClock{}
	defer context.AfterFunc(ctx, func() { stop.mark() })()

	// The pipeline outlives ctx so that in-flight work can finish during
	// the shutdown grace period; each generation's own context ends its
	// work at revocation, and abandon ends whatever is left.
	workCtx, abandon := context.WithCancel(context.WithoutCancel(ctx))
	defer abandon()
	pipeDone := c.pipe.start(workCtx)

	for ctx.Err() == nil {
		gen, err := cg.Next(ctx)
		if err != nil {
			if ctx.Err() != nil {
				break
			}
			// kafka-go backs off (JoinGroupBackoff) before the next attempt.
			c.brokerOK.Store(false)
			c.log.Warn().Err(err).Msg("consumer group generation failed; rejoining")
			continue
		}
		c.brokerOK.Store(true)
		c.runGeneration(ctx, workCtx, gen, stop, leave)
	}

	c.assigned.Store(0)
	// One deadline for everything left: the manager has normally started
	// leaving the group right after its final commit already. Close can
	// hang on an unreachable broker, so it is only waited for until then.
	deadline := stop.mark().Add(c.cfg.ShutdownTimeout)
	if !leave.wait(deadline) {
		c.log.Warn().Msg("consumer group close timed out")
	}
	abandon()
	// Goroutines told to stop just now get a moment even when the budget
	// is spent; they normally stop at once.
	deadline = later(deadline, time.Now().Add(stopGrace))
	if !pipeDone(deadline) {
		c.log.Warn().Msg("pipeline did not stop by the shutdown deadline")
	}
	if !waitUntil(&c.fetchers, deadline) {
		c.log.Warn().Msg("partition readers did not close by the shutdown deadline")
	}
	return nil
}

func (c *Consumer) addInflight(n int64) {
	v := c.inflight.Add(n)
	for {
		p := c.inflightPeak.Load()
		if v <= p || c.inflightPeak.CompareAndSwap(p, v) {
			return
		}
	}
}

// settle takes a record out of the in-flight accounting; with ack it also
// resolves its offset, making it committable.
func (c *Consumer) settle(r *record, ack bool) {
	if !r.settled.CompareAndSwap(false, true) {
		return
	}
	if ack {
		r.done()
	}
	c.addInflight(-1)
	r.gen.pending.Add(-1)
}
