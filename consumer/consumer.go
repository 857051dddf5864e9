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
	"strconv"
	"strings"
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
	cfg    Config
	scorer Scorer
	sink   Sink
	log    zerolog.Logger
	m      *metrics

	// in carries fetched records to the batch loop; unbuffered so a
	// fetcher holds at most one record while the pipeline is full.
	in chan *record
	// slots holds one token per batch between fetch and the end of its
	// scoring (and its acknowledgement, unless it has to wait for an
	// earlier batch of its partition: see worker); work hands flushed
	// batches to the workers and never blocks because of slots.
	slots chan struct{}
	work  chan *batch
	// waiting holds one token per scored batch waiting off its worker for
	// its turn to be acknowledged (see worker).
	waiting chan struct{}
	// pipe counts the pipeline's goroutines: batch loop, workers and
	// batches waiting for their turn to be acknowledged.
	pipe sync.WaitGroup
	// cur is the current generation, for OldestUnacked; nil between
	// generations.
	cur atomic.Pointer[genState]
	// acking holds when each batch being acknowledged began (its results
	// and dead letters written, and retried until the sink acknowledges
	// them), for OldestAcknowledgement.
	ackMu  sync.Mutex
	acking map[*batch]time.Time

	// drainLimit is the part of ShutdownTimeout the drain may use (see
	// Config.shutdownBudget).
	drainLimit time.Duration
	// fetchers counts partition fetch goroutines, reader close included;
	// Run waits for them (bounded) before it returns.
	fetchers sync.WaitGroup
	// canary is a small event that scored successfully, the probe that
	// tells a poisonous event (the canary still scores) from a scorer
	// outage (it fails too). Nil until something scored.
	canary atomic.Pointer[schema.TranscriptEvent]

	running  atomic.Bool
	assigned atomic.Int32
	// member is true while this consumer holds a generation of the group,
	// whether or not it got partitions.
	member   atomic.Bool
	brokerOK atomic.Bool

	messagesIn, published, deadLettered atomic.Uint64
	inflight, inflightPeak              atomic.Int64
	commits, commitErrors, generations  atomic.Uint64
	pauses, expulsions, offsetResets    atomic.Uint64
	batches                             [numTriggers]atomic.Uint64

	// hooks lets tests observe internals; zero in production.
	hooks testHooks
}

// testHooks are called, when set, at points tests need to observe.
type testHooks struct {
	assigned func(generation int32, memberID string, partitions []int)
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

// genState is what one generation owns: its partitions' watermarks and
// whether it has been revoked (records of a revoked generation are dropped
// from the pipeline; the partition's new owner re-reads them).
type genState struct {
	id      int32
	parts   map[int]*partState
	revoked atomic.Bool
	// ctx is the context of this generation's scoring, publishing and dead
	// letters; cancel ends it when the generation is revoked, so abandoned
	// work stops instead of running on beside the next generation.
	ctx    context.Context
	cancel context.CancelFunc
	// pending counts this generation's records handed to the pipeline and
	// not yet acknowledged, so the generation end can wait for them.
	pending atomic.Int64
}

type partState struct {
	partition int
	wm        *Watermark
	// committed is the last committed offset (negative: none yet); written
	// by the manager, read by the fetcher for the span limit.
	committed atomic.Int64
	// first is the first offset fetched (-1: none yet), the base of the
	// uncommitted span while nothing is committed.
	first atomic.Int64
	// logEnd is the log end offset (high water mark) seen by the last fetch
	// (-1: none yet).
	logEnd atomic.Int64
	// tail is the turn of the last batch dispatched with records of this
	// partition, the one the next batch acknowledges after; touched by the
	// batch loop only.
	tail <-chan struct{}
}

func newPartState(partition int, committed int64) *partState {
	ps := &partState{partition: partition, wm: NewWatermark(), tail: closedChan()}
	ps.committed.Store(committed)
	ps.first.Store(-1)
	ps.logEnd.Store(-1)
	return ps
}

// base is the offset the uncommitted span starts from: the committed offset,
// or the first fetched one while nothing is committed; -1 if neither.
func (ps *partState) base() int64 {
	if c := ps.committed.Load(); c >= 0 {
		return c
	}
	return ps.first.Load()
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
	m, err := newMetrics(reg)
	if err != nil {
		return nil, err
	}
	c := &Consumer{
		cfg: cfg, scorer: scorer, sink: sink, m: m,
		log:     log.With().Str("component", "consumer").Str("topic", cfg.Topic).Logger(),
		in:      make(chan *record),
		slots:   make(chan struct{}, cfg.MaxInflightBatches),
		work:    make(chan *batch, cfg.MaxInflightBatches),
		waiting: make(chan struct{}, cfg.MaxInflightBatches),
	}
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
// scorer_assigned_partitions shows idle members.
func (c *Consumer) Ready() bool {
	return c.member.Load() && c.brokerOK.Load()
}

// Stats returns a snapshot of the counters.
func (c *Consumer) Stats() Stats {
	s := Stats{
		MessagesIn: c.messagesIn.Load(), Published: c.published.Load(),
		DeadLettered: c.deadLettered.Load(), Inflight: c.inflight.Load(),
		InflightPeak: c.inflightPeak.Load(), Commits: c.commits.Load(),
		CommitErrors: c.commitErrors.Load(), Generations: c.generations.Load(),
		Assigned: int(c.assigned.Load()), Batches: map[string]uint64{},
		Pauses: c.pauses.Load(), Expulsions: c.expulsions.Load(), OffsetResets: c.offsetResets.Load(), OldestUnacked: c.OldestUnacked(),
		OldestAcknowledgement: c.OldestAcknowledgement(),
	}
	for t := range c.batches {
		if n := c.batches[t].Load(); n > 0 {
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
	c.ackMu.Lock()
	defer c.ackMu.Unlock()
	var oldest time.Duration
	for _, at := range c.acking {
		oldest = max(oldest, time.Since(at))
	}
	return oldest
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
	cg, err := kafka.NewConsumerGroup(kafka.ConsumerGroupConfig{
		ID:                c.cfg.GroupID,
		Brokers:           c.cfg.Brokers,
		Dialer:            c.cfg.Dialer,
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
	leave := &groupCloser{cg: cg, done: make(chan struct{})}
	stop := &stopClock{}
	defer context.AfterFunc(ctx, func() { stop.mark() })()

	// The pipeline outlives ctx so that in-flight work can finish during
	// the shutdown grace period; each generation's own context ends its
	// work at revocation, and abandon ends whatever is left.
	workCtx, abandon := context.WithCancel(context.WithoutCancel(ctx))
	defer abandon()
	pipeDone := c.startPipeline(workCtx)

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
// kafka-go leave the group instead of joining a next generation.
type groupCloser struct {
	once sync.Once
	cg   *kafka.ConsumerGroup
	done chan struct{} // closed when Close returned
}

// start begins closing the group; later calls do nothing.
func (g *groupCloser) start() {
	g.once.Do(func() {
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

// runGeneration consumes the generation's partitions until it ends (a
// rebalance) or ctx ends, and returns once its final commit was attempted.
//
// Only the manager runs under gen.Start: in kafka-go the generation ends as
// soon as any Start'd function returns, and with it the heartbeats. The
// fetchers are plain goroutines stopped by the manager, so the generation
// (and its heartbeats) last until the manager has drained and committed,
// or until a heartbeat fails (a rebalance).
func (c *Consumer) runGeneration(ctx, workCtx context.Context, gen *kafka.Generation, stop *stopClock, leave *groupCloser) {
	assignments := gen.Assignments[c.cfg.Topic]
	g := &genState{id: gen.ID, parts: make(map[int]*partState, len(assignments))}
	g.ctx, g.cancel = context.WithCancel(workCtx)
	ids := make([]int, 0, len(assignments))
	for _, pa := range assignments {
		g.parts[pa.ID] = newPartState(pa.ID, pa.Offset)
		ids = append(ids, pa.ID)
	}
	c.generations.Add(1)
	c.cur.Store(g)
	c.assigned.Store(int32(len(ids)))
	c.member.Store(true)
	c.m.assigned.Set(float64(len(ids)))
	c.log.Info().Int32("generation", gen.ID).Str("member", gen.MemberID).Ints("partitions", ids).Msg("generation started")
	if c.hooks.assigned != nil {
		c.hooks.assigned(gen.ID, gen.MemberID, ids)
	}

	fctx, stopFetching := context.WithCancel(ctx)
	// handing counts fetchers that may still hand records to the pipeline.
	var handing sync.WaitGroup
	for _, pa := range assignments {
		handing.Add(1)
		c.fetchers.Go(func() { c.fetch(fctx, g, g.parts[pa.ID], pa.Offset, handing.Done) })
	}
	finished := make(chan struct{})
	gen.Start(func(gctx context.Context) {
		defer close(finished)
		defer stopFetching()
		m := genManager{gen: gen, g: g, stopFetching: stopFetching, handing: &handing, stop: stop, leave: leave}
		c.manage(ctx, gctx, &m)
	})
	<-finished
}

// genManager is what a generation's manager works with.
type genManager struct {
	gen          *kafka.Generation
	g            *genState
	stopFetching context.CancelFunc
	handing      *sync.WaitGroup
	stop         *stopClock
	leave        *groupCloser
}

// manage runs the generation's commit loop and its end: stop fetching,
// drain with a deadline, revoke, commit once and, on shutdown, start
// leaving the group before the generation ends.
func (c *Consumer) manage(ctx, gctx context.Context, m *genManager) {
	gen, g := m.gen, m.g
	tick := time.NewTicker(c.cfg.CommitInterval)
	defer tick.Stop()
	// Periodic commits run in the background, one at a time, so that a slow
	// commit never delays noticing the generation's end or the shutdown.
	committing := closedChan()
loop:
	for {
		select {
		case <-tick.C:
			c.observePartitions(g)
			select {
			case <-committing:
				committing = c.commitAsync(gen, g)
			default: // the previous commit is still running
			}
		case <-gctx.Done():
			break loop
		case <-ctx.Done():
			break loop
		}
	}
	m.stopFetching()
	fetchersStopped := make(chan struct{})
	go func() {
		m.handing.Wait()
		close(fetchersStopped)
	}()
	why := "rebalance"
	if ctx.Err() != nil {
		why = "shutdown"
	}
	// kafka-go ends the generation when a heartbeat fails but drops the
	// error, so a member expelled (session expired after a long pause)
	// looks like one in an ordinary rebalance. Ask the coordinator: commit
	// what is done now. If it answers that this member or generation is
	// gone, the partitions may already be another member's, which is
	// re-reading them: abandon everything at once instead of draining and
	// publishing beside it.
	if why == "rebalance" && !g.revoked.Load() {
		<-committing
		if err := c.commitOffsets(gen, g, true); expelled(err) {
			c.expel(g, err)
		}
	}
	if !g.revoked.Load() {
		c.drain(ctx, gctx, g, fetchersStopped, m.stop)
	} else {
		why = "expelled"
	}
	if n := g.pending.Load(); n > 0 {
		c.log.Warn().Int64("abandoned", n).Str("reason", why).Msg("generation ended with work in flight; it will be redelivered")
	}
	// From here on nothing of this generation is published or
	// dead-lettered: work still running is cancelled, and the new owner
	// redoes it. The commit below covers what was acknowledged until now;
	// after it the watermarks are unreachable and late results resolve
	// them in vain.
	g.revoke()
	if why == "shutdown" {
		deadline := m.stop.mark().Add(c.cfg.ShutdownTimeout)
		if !waitChan(committing, deadline) || !waitChan(c.commitAsync(gen, g), deadline) {
			c.log.Warn().Int32("generation", g.id).Msg("final commit did not finish by the shutdown deadline")
		}
		// Leave now, while this function still holds the generation open:
		// kafka-go then sees the group closed rather than the generation
		// ended, and leaves instead of joining a next generation (a
		// needless rebalance for the other members).
		m.leave.start()
		waitChan(gctx.Done(), later(deadline, time.Now().Add(stopGrace)))
	} else if why == "rebalance" {
		<-committing // bounded by the coordinator connection's timeout
		c.commit(gen, g)
	}
	c.assigned.Store(0)
	c.member.Store(false)
	c.cur.CompareAndSwap(g, nil)
	c.m.assigned.Set(0)
	for p := range g.parts {
		l := []string{c.cfg.Topic, strconv.Itoa(p)}
		c.m.lag.DeleteLabelValues(l...)
		c.m.committedLag.DeleteLabelValues(l...)
		c.m.oldestUnacked.DeleteLabelValues(l...)
		c.m.paused.DeleteLabelValues(l...)
	}
	c.log.Info().Int32("generation", g.id).Str("reason", why).Msg("generation ended")
}

// drain waits until the fetchers have stopped and every record the
// generation handed to the pipeline is settled, or until the drain
// deadline: drainLimit after shutdown began, or RevokeTimeout after the
// generation ended (heartbeats have stopped then), whichever comes first.
func (c *Consumer) drain(ctx, gctx context.Context, g *genState, fetchersStopped <-chan struct{}, stop *stopClock) {
	var revokeBy time.Time
	for {
		now := time.Now()
		if gctx.Err() != nil && revokeBy.IsZero() {
			revokeBy = now.Add(c.cfg.RevokeTimeout)
		}
		deadline := revokeBy
		if ctx.Err() != nil {
			if d := stop.mark().Add(c.drainLimit); deadline.IsZero() || d.Before(deadline) {
				deadline = d
			}
		}
		stopped := false
		select {
		case <-fetchersStopped:
			stopped = true
		default:
		}
		if (stopped && g.pending.Load() == 0) || !now.Before(deadline) {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// closedChan returns a closed channel: "nothing running".
func closedChan() <-chan struct{} {
	ch := make(chan struct{})
	close(ch)
	return ch
}

// commitAsync runs commit in the background and returns a channel closed
// when it returned, so a caller can stop waiting at a deadline (a stuck
// commit ends when the generation's connection closes).
func (c *Consumer) commitAsync(gen *kafka.Generation, g *genState) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := c.commit(gen, g); expelled(err) {
			c.expel(g, err)
		}
	}()
	return done
}

// expelled reports whether a coordinator error says this member is no
// longer part of the generation: its partitions may already be another
// member's.
func expelled(err error) bool {
	return errors.Is(err, kafka.UnknownMemberId) || errors.Is(err, kafka.IllegalGeneration) ||
		errors.Is(err, kafka.FencedInstanceID)
}

// expel abandons the generation's work at once: nothing more of it is
// published or dead-lettered (the records are redelivered to the
// partitions' new owners).
func (c *Consumer) expel(g *genState, err error) {
	if g.revoked.Load() {
		return
	}
	c.expulsions.Add(1)
	c.log.Error().Err(err).Int32("generation", g.id).Int64("abandoned", g.pending.Load()).
		Msg("expelled from the group (session expired or generation over): abandoning this generation's work unpublished")
	g.revoke()
}

// revoke marks the generation revoked and ends its context: no more of its
// work is acknowledged.
func (g *genState) revoke() {
	g.revoked.Store(true)
	g.cancel()
}

// commit commits each partition's watermark that moved since the last
// commit and returns the commit's error. Only the generation's manager
// calls it.
func (c *Consumer) commit(gen *kafka.Generation, g *genState) error {
	return c.commitOffsets(gen, g, false)
}

// commitOffsets is commit; with probe it also sends the offsets already
// committed, so that the coordinator answers even when nothing moved
// (re-committing an offset changes nothing). Nothing is sent when no
// partition has an offset to commit at all.
func (c *Consumer) commitOffsets(gen *kafka.Generation, g *genState, probe bool) error {
	offsets := map[int]int64{}
	for p, ps := range g.parts {
		next, ok := ps.wm.Committable()
		switch done := ps.committed.Load(); {
		case ok && next > done:
			offsets[p] = next
		case probe && done >= 0:
			offsets[p] = done
		}
	}
	if len(offsets) == 0 {
		return nil
	}
	start := time.Now()
	err := gen.CommitOffsets(map[string]map[int]int64{c.cfg.Topic: offsets})
	c.m.commitTime.Observe(time.Since(start).Seconds())
	if err != nil {
		// Not fatal: the next commit covers it, and if the generation is
		// gone the new owner resumes from the previous commit.
		c.commitErrors.Add(1)
		c.m.commitErrors.Inc()
		c.brokerOK.Store(false)
		err = fmt.Errorf("consumer: commit generation %d: %w", g.id, err)
		c.log.Warn().Err(err).Msg("commit failed")
		return err
	}
	c.commits.Add(1)
	c.brokerOK.Store(true)
	for p, o := range offsets {
		g.parts[p].committed.Store(o)
	}
	c.observePartitions(g)
	c.log.Debug().Int32("generation", g.id).Interface("offsets", offsets).Msg("committed")
	return nil
}

// fetch reads one partition from offset and hands records to the batch
// loop until ctx ends; stopped is called once it hands over no more
// records, before its reader is closed. It never returns early on errors:
// the partition would silently stop being read.
func (c *Consumer) fetch(ctx context.Context, g *genState, ps *partState, offset int64, stopped func()) {
	r := kafka.NewReader(kafka.ReaderConfig{
		Brokers:   c.cfg.Brokers,
		Topic:     c.cfg.Topic,
		Partition: ps.partition,
		Dialer:    c.cfg.Dialer,
		MinBytes:  1,
		// Room for one record of the largest size we accept (plus
		// framing) so an oversized record reaches the DLQ path.
		MaxBytes:       c.cfg.MaxMessageBytes + schema.FetchSlack,
		MaxWait:        c.cfg.FetchMaxWait,
		QueueCapacity:  fetchQueueCapacity,
		ReadBackoffMin: c.cfg.RetryBackoff,
		ReadBackoffMax: c.cfg.RetryBackoffMax,
		Logger: kafka.LoggerFunc(func(f string, a ...any) {
			c.log.Debug().Int("partition", ps.partition).Msgf("kafka-go: "+f, a...)
		}),
		ErrorLogger: kafka.LoggerFunc(func(f string, a ...any) { c.readerError(ps, f, a...) }),
	})
	defer func() {
		// Reader.Close can block for MaxWait or longer (kafka-go #428).
		done := make(chan struct{})
		go func() { _ = r.Close(); close(done) }()
		select {
		case <-done:
		case <-time.After(c.cfg.FetchMaxWait + 5*time.Second):
			c.log.Warn().Int("partition", ps.partition).Msg("reader close timed out")
		}
	}()
	defer stopped() // runs before the reader is closed
	offset = c.checkOffset(ctx, ps, offset)
	if err := r.SetOffset(offset); err != nil {
		c.log.Error().Err(err).Int("partition", ps.partition).Msg("set offset")
		<-ctx.Done()
		return
	}
	partLabel := strconv.Itoa(ps.partition)
	backoff := c.cfg.RetryBackoff
	for {
		m, err := r.FetchMessage(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			c.brokerOK.Store(false)
			c.log.Warn().Err(err).Int("partition", ps.partition).Msg("fetch failed; retrying")
			if !sleepCtx(ctx, backoff) {
				return
			}
			backoff = min(backoff*2, c.cfg.RetryBackoffMax)
			continue
		}
		backoff = c.cfg.RetryBackoff
		c.brokerOK.Store(true)
		c.messagesIn.Add(1)
		c.m.messagesIn.WithLabelValues(c.cfg.Topic).Inc()
		c.m.lag.WithLabelValues(c.cfg.Topic, partLabel).Set(float64(max(m.HighWaterMark-m.Offset-1, 0)))
		ps.logEnd.Store(m.HighWaterMark)
		ps.first.CompareAndSwap(-1, m.Offset)
		if !c.waitSpan(ctx, ps, m.Offset) {
			return
		}
		done, err := ps.wm.Track(m.Offset)
		if err != nil {
			// A stale buffered message (kafka-go #1398): already tracked.
			c.log.Debug().Err(err).Int("partition", ps.partition).Int64("offset", m.Offset).Msg("skipping repeated offset")
			continue
		}
		rec := &record{msg: m, gen: g, ps: ps, done: done}
		c.addInflight(1)
		g.pending.Add(1)
		select {
		case c.in <- rec:
		case <-ctx.Done():
			// Never handed over: it stays unresolved, so the commit stops
			// before it and the next owner reads it again.
			c.addInflight(-1)
			g.pending.Add(-1)
			return
		}
	}
}

// readerError logs what a partition reader reports through kafka-go's
// ErrorLogger. One of its lines is a silent offset reset (the reader was
// behind the log start, retention deleted what it was about to read, and
// it skips forward): that one is counted in scorer_offset_resets_total
// and logged at error level, since records were lost to retention.
func (c *Consumer) readerError(ps *partState, format string, args ...any) {
	if strings.HasPrefix(format, "the kafka reader is reading before the first offset") {
		c.offsetReset(ps, fmt.Sprintf(format, args...))
		return
	}
	c.log.Warn().Int("partition", ps.partition).Msgf("kafka-go: "+format, args...)
}

// offsetReset counts and logs a reset of the partition's read position.
func (c *Consumer) offsetReset(ps *partState, what string) {
	c.offsetResets.Add(1)
	c.m.offsetResets.WithLabelValues(c.cfg.Topic, strconv.Itoa(ps.partition)).Inc()
	c.log.Error().Int("partition", ps.partition).Str("reset", what).
		Msg("offset reset: the position was outside the partition's log (retention passed it, or the topic was re-created)")
}

// offsetCheckTimeout bounds the log-range lookup of checkOffset.
const offsetCheckTimeout = 10 * time.Second

// checkOffset returns where to start reading the partition: offset, unless
// it lies outside the partition's log. kafka-go moves an offset before the
// log start to the start without a word, and retries one past the log end
// forever (the partition then silently stops being read). Both are reset
// here instead, counted and logged: before the start to the start, past
// the end to StartOffset's end. If the log range cannot be read, offset is
// returned as is.
func (c *Consumer) checkOffset(ctx context.Context, ps *partState, offset int64) int64 {
	if offset < 0 { // FirstOffset or LastOffset: kafka-go resolves them
		return offset
	}
	ctx, cancel := context.WithTimeout(ctx, offsetCheckTimeout)
	defer cancel()
	// Any bootstrap broker finds the leader; a dead one is skipped.
	var conn *kafka.Conn
	var err error
	for _, b := range c.cfg.Brokers {
		if conn, err = c.cfg.Dialer.DialLeader(ctx, "tcp", b, c.cfg.Topic, ps.partition); err == nil || ctx.Err() != nil {
			break
		}
	}
	if err != nil {
		c.log.Warn().Err(err).Int("partition", ps.partition).Msg("could not check the committed offset against the log; reading from it")
		return offset
	}
	defer conn.Close()
	first, last, err := conn.ReadOffsets()
	if err != nil {
		c.log.Warn().Err(err).Int("partition", ps.partition).Msg("could not check the committed offset against the log; reading from it")
		return offset
	}
	to := offset
	switch {
	case offset < first:
		to = first
	case offset > last && c.cfg.StartOffset == kafka.LastOffset:
		to = last
	case offset > last:
		to = first
	}
	if to != offset {
		c.offsetReset(ps, fmt.Sprintf("committed offset %d outside the log [%d, %d]; reading from %d", offset, first, last, to))
		// The stored offset is meaningless now: forget it, so the first
		// commit writes the new position even when it is lower.
		ps.committed.Store(-1)
	}
	return to
}

// spanPoll is how often a paused fetcher checks whether a commit made room.
const spanPoll = 20 * time.Millisecond

// waitSpan pauses the partition's fetching while offset lies MaxUncommitted
// or more past the committed offset, so that one stuck record (a dead
// letter that cannot be written, a publish that keeps failing) cannot grow
// the uncommitted span, the memory of waiting batches and the duplicates a
// crash would replay without bound. It reports false if ctx ended first.
func (c *Consumer) waitSpan(ctx context.Context, ps *partState, offset int64) bool {
	limit := int64(c.cfg.MaxUncommitted)
	if offset-ps.base() < limit {
		return true
	}
	label := []string{c.cfg.Topic, strconv.Itoa(ps.partition)}
	c.pauses.Add(1)
	c.m.paused.WithLabelValues(label...).Set(1)
	defer c.m.paused.WithLabelValues(label...).Set(0)
	c.log.Warn().Int("partition", ps.partition).Int64("offset", offset).Int64("committed", ps.committed.Load()).
		Int64("limit", limit).Msg("uncommitted span reached MAX_UNCOMMITTED; fetching paused until commits catch up")
	for offset-ps.base() >= limit {
		if !sleepCtx(ctx, spanPoll) {
			return false
		}
	}
	c.log.Info().Int("partition", ps.partition).Int64("committed", ps.committed.Load()).Msg("fetching resumed")
	return true
}

// observePartitions updates the per-partition gauges of the generation:
// committed lag (log end minus the committed offset, what a crash would
// replay plus what is unread) and the age of the oldest unacknowledged
// record.
func (c *Consumer) observePartitions(g *genState) {
	for p, ps := range g.parts {
		part := strconv.Itoa(p)
		if end, base := ps.logEnd.Load(), ps.base(); end >= 0 && base >= 0 {
			c.m.committedLag.WithLabelValues(c.cfg.Topic, part).Set(float64(max(end-base, 0)))
		}
		age := 0.0
		if at, ok := ps.wm.Oldest(); ok {
			age = time.Since(at).Seconds()
		}
		c.m.oldestUnacked.WithLabelValues(c.cfg.Topic, part).Set(age)
		// Add(0) makes the series exist at 0 for every owned partition (an
		// alert or dashboard then sees "not paused" rather than nothing)
		// without clearing a pause in progress.
		c.m.paused.WithLabelValues(c.cfg.Topic, part).Add(0)
	}
}

func (c *Consumer) addInflight(n int64) {
	v := c.inflight.Add(n)
	c.m.inflight.Set(float64(v))
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

// sleepCtx sleeps d or until ctx ends; it reports whether it slept fully.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
