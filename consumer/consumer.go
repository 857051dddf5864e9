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
	"net"
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

// stopGrace is the least time Run waits for its pipeline and readers after
// telling them to stop, and so the most it may overrun ShutdownTimeout.
const stopGrace = 500 * time.Millisecond

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// groupCloser closes the ConsumerGroup at most once, in the background.
// Closing it while the generation's manager is still running is what makes
// kafka-go leave the group instead of joining a next generation, as long as
// the generation has not ended; for one that has, see refuseRejoin.
type groupCloser struct {
	once sync.Once
	cg   *kafka.ConsumerGroup
	done chan struct{} // closed when Close returned
	// stopping is closed when closing starts: a join held back then
	// (holdRejoin) is refused, and a dial after it, the leave's, is not
	// held (see waitRejoin).
	stopping chan struct{}
	// rejoinAt is when the group's next dial may go (Unix nanoseconds; see
	// holdRejoin).
	rejoinAt atomic.Int64
	// brokers is the length of the bootstrap list kafka-go dials through.
	brokers int
	// refusals is how many of the group's next dials fail (see
	// refuseRejoin).
	refusals atomic.Int32
}

// errNoRejoin is the dial error that stops kafka-go's rejoin.
var errNoRejoin = errors.New("consumer: leaving the group, not joining its next generation")

// dialer returns d for the ConsumerGroup's own connections, with the gate
// refuseRejoin closes in front of its dial (TLS and SASL still run on top,
// as kafka-go applies them to what DialFunc returns).
func (g *groupCloser) dialer(d *kafka.Dialer) *kafka.Dialer {
	gd := *d
	next := d.DialFunc
	if next == nil { // what kafka-go dials with then; DualStack is net's default now
		next = (&net.Dialer{LocalAddr: d.LocalAddr, FallbackDelay: d.FallbackDelay, KeepAlive: d.KeepAlive}).DialContext
	}
	gd.DialFunc = func(ctx context.Context, network, address string) (net.Conn, error) {
		if g.takeRefusal() {
			return nil, errNoRejoin
		}
		if err := g.waitRejoin(ctx); err != nil {
			return nil, err
		}
		return next(ctx, network, address)
	}
	return &gd
}

// takeRefusal uses up one refusal if any is left and reports whether it did.
func (g *groupCloser) takeRefusal() bool {
	for {
		n := g.refusals.Load()
		if n <= 0 {
			return false
		}
		if g.refusals.CompareAndSwap(n, n-1) {
			return true
		}
	}
}

// refuseRejoin makes the group's next attempt to reach the cluster fail.
// Once a generation has ended (a heartbeat saw a rebalance), kafka-go joins
// the next one as soon as the generation's functions return, without
// looking whether the group is being closed: only a failed connection
// stops that join, and kafka-go then leaves the group (with the member id
// it has, on fresh connections), sees the group closed and stops.
//
// A join starts by finding the coordinator through the bootstrap list, and
// kafka-go (v0.4.51, makeConnect) dials its brokers one after another
// until one answers: a single refused dial only moved the join on to the
// next broker, and with two or more brokers the stopped member joined the
// next generation and left it at once, rebalancing every member twice. So
// as many dials are refused as there are bootstrap brokers, one per
// address tried (kafka-go calls DialFunc once for each), which fails that
// round whatever its length; the leave's round after it goes through. Were
// a round ever shorter (a custom Dialer.Resolver failing an address before
// its dial), a refusal would be left for the leave's round, which then
// goes on to the brokers after it: at worst a leave that fails (the
// coordinator drops the member at the rebalance timeout), never a join.
//
// Call it before the generation's manager returns, and only for a
// generation that has ended: for a live one kafka-go's next dials are the
// leave itself.
func (g *groupCloser) refuseRejoin() {
	g.refusals.Store(int32(g.brokers))
}

// start begins closing the group; later calls do nothing.
func (g *groupCloser) start() {
	g.once.Do(func() {
		if g.stopping != nil {
			close(g.stopping)
		}
		go func() {
			_ = g.cg.Close()
			close(g.done)
		}()
	})
}

// wait starts closing if needed and reports whether Close returned by
// deadline.
func (g *groupCloser) wait(deadline time.Time) bool {
	g.start()
	return waitChan(g.done, deadline)
}

// stopClock records when Run's ctx ended: the start of the shutdown budget.
type stopClock struct{ at atomic.Int64 }

// mark records now as the stop time unless one is recorded, and returns the
// recorded time.
func (s *stopClock) mark() time.Time {
	s.at.CompareAndSwap(0, time.Now().UnixNano())
	return time.Unix(0, s.at.Load())
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

// waitChan waits until ch is closed or deadline passes; it reports whether
// ch was closed.
func waitChan(ch <-chan struct{}, deadline time.Time) bool {
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	select {
	case <-ch:
		return true
	case <-t.C:
		return false
	}
}

// waitUntil waits for wg until deadline; it reports whether wg finished.
func waitUntil(wg *sync.WaitGroup, deadline time.Time) bool {
	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	return waitChan(done, deadline)
}
