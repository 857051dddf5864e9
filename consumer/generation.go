package consumer

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/segmentio/kafka-go"
)

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
	// commitNow carries a paused partition's request for an early commit
	// (see waitSpan), or a rewound one's (see lostTo).
	commitNow chan struct{}
}

// runGeneration consumes the generation's partitions until it ends (a
// rebalance) or ctx ends, and returns once its final commit was attempted.
//
// Only the manager runs under gen.Start: in kafka-go the generation ends as
// soon as any Start'd function returns, and with it the heartbeats. The
// manager starts the fetchers as plain goroutines and stops them, so the
// generation (and its heartbeats) last until the manager has drained and
// committed, or until a heartbeat fails (a rebalance).
func (c *Consumer) runGeneration(ctx, workCtx context.Context, gen *kafka.Generation, stop *stopClock, leave *groupCloser) {
	assignments := gen.Assignments[c.cfg.Topic]
	g := &genState{id: gen.ID, parts: make(map[int]*partState, len(assignments)), commitNow: make(chan struct{}, 1)}
	g.ctx, g.cancel = context.WithCancel(workCtx)
	ids := make([]int, 0, len(assignments))
	for _, pa := range assignments {
		g.parts[pa.ID] = newPartState(pa.ID, pa.Offset)
		g.parts[pa.ID].commitNow = g.commitNow
		ids = append(ids, pa.ID)
	}
	c.generations.Add(1)
	if len(ids) > 0 {
		c.topicFound()
	}
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
	if c.hooks.starting != nil {
		c.hooks.starting(gen.ID)
	}
	finished := make(chan struct{})
	gen.Start(func(gctx context.Context) {
		defer close(finished)
		defer stopFetching()
		// A generation that ended before Start runs this function without
		// waiting for it (kafka-go then rejoins at once): fetching then
		// would read partitions that are already another member's.
		held := gctx.Err() == nil
		if held {
			for _, pa := range assignments {
				handing.Add(1)
				c.fetchers.Go(func() { c.fetch(fctx, g, g.parts[pa.ID], pa.Offset, handing.Done) })
			}
		}
		m := genManager{gen: gen, g: g, stopFetching: stopFetching, handing: &handing, stop: stop, leave: leave, held: held}
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
	// held is true when kafka-go waits for the manager before it moves on
	// (the generation was live when the manager started).
	held bool
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
	turns := newCommitTurns()
	start := func() <-chan struct{} { return c.commitAsync(gen, g, false) }
loop:
	for {
		select {
		case <-tick.C:
			c.observePartitions(g)
			turns.tick(start)
		case <-g.commitNow:
			turns.request(start)
		case <-turns.again:
			turns.follow(start)
		case <-gctx.Done():
			break loop
		case <-ctx.Done():
			break loop
		case <-g.ctx.Done():
			// Expelled (a periodic commit learnt it): the partitions may
			// be another member's already. End the generation now, so
			// kafka-go rejoins, rather than fetch on for work that is
			// dropped until some heartbeat fails.
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
	// A rebalance's end must fit in the rebalance timeout, or the
	// coordinator drops this member: the probe and the final commit wait at
	// most a commit budget each (see Config.rebalanceCommitBudget) beside
	// the drain's RevokeTimeout. A commit still running past it finishes
	// or fails in the background; only acknowledged work is in it.
	// Should a shutdown begin meanwhile, the probe also ends at the drain's
	// deadline and the final commit at the shutdown's: the rebalance budget
	// alone would let them overrun SHUTDOWN_TIMEOUT.
	budget := c.cfg.rebalanceCommitBudget()
	if why == "rebalance" && !g.revoked.Load() {
		if !c.commitBy(ctx, m, &turns.running, true, time.Now().Add(budget), c.drainLimit) {
			c.log.Warn().Int32("generation", g.id).Dur("budget", budget).Msg("commit at the rebalance did not answer in time; draining without it")
		}
	}
	if !g.revoked.Load() {
		if c.hooks.draining != nil {
			c.hooks.draining(g.id, why)
		}
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
	switch why {
	case "shutdown":
		if !c.commitBy(ctx, m, &turns.running, false, m.stop.mark().Add(c.cfg.ShutdownTimeout), c.cfg.ShutdownTimeout) {
			c.log.Warn().Int32("generation", g.id).Msg("final commit did not finish by the shutdown deadline")
		}
	case "rebalance":
		if !c.commitBy(ctx, m, &turns.running, false, time.Now().Add(budget), c.cfg.ShutdownTimeout) {
			c.log.Warn().Int32("generation", g.id).Dur("budget", budget).Msg("final commit did not finish within the rebalance's commit budget or by the shutdown deadline")
		}
	}
	// Only a generation without partitions can have been ended by a
	// missing topic (see holdIfTopicMissing); the look costs an idle
	// member's ordinary rebalance one metadata request. It runs before this
	// function returns, so that kafka-go, when it waits for it (held), sees
	// the hold before it dials for the next join.
	if why == "rebalance" && len(g.parts) == 0 && ctx.Err() == nil {
		c.holdIfTopicMissing(ctx, m.leave, g.id)
	}
	// A shutdown leaves the group whenever it began, also during a
	// rebalance's drain (a rolling update stopping the member whose
	// neighbour's exit caused the rebalance): rejoining would take
	// partitions in the next generation only to give them up in the one
	// after, rebalancing every member twice.
	if ctx.Err() != nil {
		// Leave now, while this function still holds the generation open:
		// kafka-go then sees the group closed rather than the generation
		// ended, and leaves instead of joining a next generation (a
		// needless rebalance for the other members). A generation that
		// ended already is past that: kafka-go rejoins once this returns
		// unless its dials are refused (all of a round through the
		// bootstrap list: see refuseRejoin). One that ended before this
		// manager started is not waited for (kafka-go may be joining
		// already, and the refused dials would be its leave's), so it is
		// left alone.
		if gctx.Err() != nil && m.held {
			m.leave.refuseRejoin()
		}
		m.leave.start()
		waitChan(gctx.Done(), later(m.stop.mark().Add(c.cfg.ShutdownTimeout), time.Now().Add(stopGrace)))
	}
	c.assigned.Store(0)
	c.member.Store(false)
	c.cur.CompareAndSwap(g, nil)
	c.m.assigned.Set(0)
	c.endPartitions(g)
	c.log.Info().Int32("generation", g.id).Str("reason", why).Bool("leaving", ctx.Err() != nil).Msg("generation ended")
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

// commitBy waits for the running commit (*committing), then starts one
// more (a probe with probe) and waits for it, until deadline or, once ctx
// ends, until limit after the stop if that is earlier; it reports whether
// both finished. *committing is left with the commit started last, so that
// none runs beside another.
func (c *Consumer) commitBy(ctx context.Context, m *genManager, committing *<-chan struct{}, probe bool, deadline time.Time, limit time.Duration) bool {
	if !waitBy(ctx, m.stop, *committing, deadline, limit) {
		return false
	}
	*committing = c.commitAsync(m.gen, m.g, probe)
	return waitBy(ctx, m.stop, *committing, deadline, limit)
}

// waitBy waits until ch is closed or deadline passes, or, once ctx ends,
// until limit after the stop if that is earlier; it reports whether ch was
// closed.
func waitBy(ctx context.Context, stop *stopClock, ch <-chan struct{}, deadline time.Time, limit time.Duration) bool {
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	stopped := ctx.Done()
	for {
		select {
		case <-ch:
			return true
		case <-t.C:
			return false
		case <-stopped:
			stopped = nil
			if d := stop.mark().Add(limit); d.Before(deadline) {
				deadline = d
				t.Reset(time.Until(d))
			}
		}
	}
}

// commitTurns runs a generation's offset commits one at a time, each
// reading the watermarks when it starts: commitOffsets' rule and lostTo rely
// on it (after a rewind between two reads, an older, higher offset reaching
// the broker last would skip the rewound records for the next owner).
// Only the manager's loop uses it.
type commitTurns struct {
	// running is closed when the last commit started has ended.
	running <-chan struct{}
	// again is running while a request for an early commit waits for it
	// to end (nil: none waits); the loop calls follow when it fires.
	again <-chan struct{}
}

func newCommitTurns() commitTurns { return commitTurns{running: closedChan()} }

func (t *commitTurns) idle() bool {
	select {
	case <-t.running:
		return true
	default:
		return false
	}
}

// tick starts a periodic commit unless one is running; a request waiting
// for the running one is answered by the next.
func (t *commitTurns) tick(start func() <-chan struct{}) {
	if t.idle() {
		t.running, t.again = start(), nil
	}
}

// request starts an early commit now or, while one runs, right after it:
// the running commit read the watermarks when it started, maybe before the
// records the request is about were acknowledged. Left to the tick, the
// partition that asked would stay paused with nothing in flight for up to
// COMMIT_INTERVAL, which may well be long: these requests are what keep a
// paused partition's commits prompt. A commit started here also answers a
// request still waiting: it reads the watermarks after the commit that one
// waited for ended, and a follow beside it would be a second commit in
// flight.
func (t *commitTurns) request(start func() <-chan struct{}) {
	if t.idle() {
		t.running, t.again = start(), nil
		return
	}
	t.again = t.running
}

// follow starts the commit a request left waiting, once again has fired
// (the commit it waited for has ended).
func (t *commitTurns) follow(start func() <-chan struct{}) {
	t.running, t.again = start(), nil
}

// closedChan returns a closed channel: "nothing running".
func closedChan() <-chan struct{} {
	ch := make(chan struct{})
	close(ch)
	return ch
}

// commitAsync runs commitOffsets in the background and returns a channel closed
// when it returned, so a caller can stop waiting at a deadline (a stuck
// commit ends when the generation's connection closes).
// With probe it re-sends committed offsets too (see commitOffsets), so the
// coordinator answers even when nothing moved and an expulsion shows.
func (c *Consumer) commitAsync(gen *kafka.Generation, g *genState, probe bool) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := c.commitOffsets(gen, g, probe); expelled(err) {
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

// commitOffsets commits each partition's watermark that moved since the
// last commit and returns the commit's error; only the generation's manager
// starts it. With probe it also sends the offsets already
// committed, so that the coordinator answers even when nothing moved
// (re-committing an offset changes nothing). Nothing is sent when no
// partition has an offset to commit at all.
func (c *Consumer) commitOffsets(gen *kafka.Generation, g *genState, probe bool) error {
	offsets := map[int]int64{}
	// before counts, for each moved partition, the records its commit
	// covers (see partState.committedRecs).
	before := map[int]int64{}
	for p, ps := range g.parts {
		next, n, ok := ps.wm.Checkpoint()
		// A watermark moves back only when the log did (Watermark.Rewind),
		// and then the lower offset is the one to write: left at the old
		// one, a restart resumes past the records now there. Comparing
		// with != rather than > needs no help from the fetcher, also when
		// a commit in flight at the rewind records the old offset after
		// it. No stale value can move the commit back otherwise: commits
		// run one at a time, each reading the watermark when it starts,
		// and each generation has watermarks and committed offsets of
		// its own.
		switch done := ps.committed.Load(); {
		case ok && next != done:
			offsets[p], before[p] = next, n
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
	for p, n := range before {
		g.parts[p].committedRecs.Store(n)
	}
	c.observePartitions(g)
	c.log.Debug().Int32("generation", g.id).Interface("offsets", offsets).Msg("committed")
	return nil
}
