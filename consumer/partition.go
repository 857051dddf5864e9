package consumer

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/scorer/scorer/internal/retry"
	"github.com/segmentio/kafka-go"
)

type partState struct {
	partition int
	wm        *Watermark
	// committed is the last committed offset (negative: none yet); written
	// by the manager, read by the fetcher for the span limit.
	committed atomic.Int64
	// committedRecs is how many of the records tracked in wm lie before the
	// last offset this generation committed: the rest would be replayed
	// after a crash, committed or not (but see uncommitted).
	committedRecs atomic.Int64
	// commitNow asks the generation's manager for a commit before its next
	// tick, when only acknowledged records hold the partition paused (nil:
	// nobody to ask).
	commitNow chan<- struct{}
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
	// turns counts the partition's turns dispatched and not yet finished:
	// batches of it being scored or waiting to be acknowledged.
	turns atomic.Int32
	// gaugeMu orders the partition's gauge writes before the generation
	// end's deletion of its series; ended is set by that deletion, so a
	// fetcher still running cannot bring an ended partition's series back.
	gaugeMu sync.Mutex
	ended   bool
}

// gauges runs set, which writes the partition's gauges, unless the
// partition's generation ended.
func (ps *partState) gauges(set func()) {
	ps.gaugeMu.Lock()
	defer ps.gaugeMu.Unlock()
	if !ps.ended {
		set()
	}
}

// end deletes the partition's gauge series (del) and keeps them deleted.
func (ps *partState) end(del func()) {
	ps.gaugeMu.Lock()
	defer ps.gaugeMu.Unlock()
	ps.ended = true
	del()
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

// uncommitted is how many records were fetched into the pipeline past the
// last successful commit, acknowledged or not: what a crash would replay.
//
// Records resolved below the offset already committed count as committed,
// whoever committed it (this generation or an earlier one): a restart
// resumes at that offset and does not replay them. After a rewind (a topic
// re-created, a truncated log) the records read again can resolve to
// exactly the committed offset; there is then nothing to commit, so no
// commit would ever count them in committedRecs, and a partition they
// paused would stay paused for good with nothing in flight. Checkpoint and
// committed are read apart, but a match is never wrong: committed holds an
// offset only once the group stores it, and the records of a resolved
// prefix lie below its next.
func (ps *partState) uncommitted() int64 {
	covered := ps.committedRecs.Load()
	if next, before, ok := ps.wm.Checkpoint(); ok && next == ps.committed.Load() {
		covered = max(covered, before)
	}
	return ps.wm.Tracked() - covered
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
// it lies outside the partition's log, which is reset here, counted and
// logged rather than left to the fetch client (silently, or, past the end,
// never). Past the end (the topic re-created, the log truncated) it goes
// where a new group starts, StartOffset's end, as Kafka's
// auto.offset.reset does. Before the start (retention deleted records the
// group had not read) it goes to the start whatever StartOffset says,
// where Kafka's latest would skip to the end: the records still kept were
// never scored, and losing them too is not what latest is chosen for (not
// reading history from before the group existed); franz-go resumes at the
// start as well when retention passes a position it is reading. If the
// log range cannot be read, offset is returned as is.
func (c *Consumer) checkOffset(ctx context.Context, ps *partState, offset int64) int64 {
	if offset < 0 { // FirstOffset or LastOffset: kafka-go resolves them
		return offset
	}
	first, last, err := c.logRange(ctx, ps)
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
		// The stored offset is meaningless now: forget it, so the
		// committed lag counts from the new position until the first
		// commit writes it.
		ps.committed.Store(-1)
	}
	return to
}

// logRange reads the partition's log start and end from its leader, within
// offsetCheckTimeout.
func (c *Consumer) logRange(ctx context.Context, ps *partState) (first, last int64, err error) {
	ctx, cancel := context.WithTimeout(ctx, offsetCheckTimeout)
	defer cancel()
	// Any bootstrap broker finds the leader; a dead one is skipped.
	var conn *kafka.Conn
	for _, b := range c.cfg.Brokers {
		if conn, err = c.cfg.kafkaDialer().DialLeader(ctx, "tcp", b, c.cfg.Topic, ps.partition); err == nil || ctx.Err() != nil {
			break
		}
	}
	if err != nil {
		return 0, 0, err
	}
	defer conn.Close()
	return conn.ReadOffsets()
}

// spanPoll is how often a paused fetcher checks whether acknowledgements
// made room.
const spanPoll = 20 * time.Millisecond

// waitSpan pauses the partition's fetching while MaxUncommitted of its
// records were handed to the pipeline past its last successful commit
// (acknowledged or not: a crash replays them all), or twice
// MaxInflightBatches of its batches are being scored or wait to be
// acknowledged (plus the one record handed to the batch loop while it cut
// the batch that reached the count: batches are counted when cut, records
// when fetched). So one stuck record (a dead letter that cannot be
// written, a publish that keeps failing), commits that keep failing (a
// coordinator without its offsets topic, a commit ACL) or a sink slower
// than scoring cannot grow the uncommitted span, the memory of the scored
// records waiting behind it and the duplicates a crash would replay without
// bound, and it holds its own partition only. Records are counted, not
// offsets: aborted transactions, compaction and retention leave gaps in the
// offsets, and a span measured in offsets would pause for good at a wide
// gap with nothing in flight to free it. A partition paused with records
// in flight shows its stall in OldestUnacked and
// scorer_oldest_unacked_seconds; one paused by failing commits has none in
// flight (it is not stuck: it resumes at the first commit that succeeds)
// and shows in readiness and scorer_commit_errors_total. While
// acknowledged records hold it, it asks the manager to commit them without
// waiting for the next tick, so the bound costs no throughput while commits
// succeed. It reports false if ctx ended first.
func (c *Consumer) waitSpan(ctx context.Context, ps *partState) bool {
	limit, maxTurns := int64(c.cfg.MaxUncommitted), int32(2*c.cfg.MaxInflightBatches)
	full := func() bool { return ps.uncommitted() >= limit || ps.turns.Load() >= maxTurns }
	if !full() {
		return true
	}
	label := []string{c.cfg.Topic, strconv.Itoa(ps.partition)}
	c.pauses.Add(1)
	ps.gauges(func() { c.m.paused.WithLabelValues(label...).Set(1) })
	defer ps.gauges(func() { c.m.paused.WithLabelValues(label...).Set(0) })
	c.log.Warn().Int("partition", ps.partition).Int64("uncommitted", ps.uncommitted()).Int("in_flight", ps.wm.Pending()).
		Int32("batches", ps.turns.Load()).Int64("committed", ps.committed.Load()).Int64("limit", limit).
		Msg("records past the last commit reached MAX_UNCOMMITTED, or batches waiting to be acknowledged twice MAX_INFLIGHT_BATCHES; fetching paused until they are committed or acknowledged")
	asked := int64(-1)
	for full() {
		// Asked once per new committable offset (lower, too, after a
		// rewind: see commitOffsets): while commits fail the periodic one
		// retries, and no more.
		if next, ok := ps.wm.Committable(); ok && next != asked && next != ps.committed.Load() {
			asked = next
			select {
			case ps.commitNow <- struct{}{}:
			default:
			}
		}
		if !retry.Sleep(ctx, spanPoll) {
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
		age := 0.0
		if at, ok := ps.wm.Oldest(); ok {
			age = time.Since(at).Seconds()
		}
		ps.gauges(func() {
			if end, base := ps.logEnd.Load(), ps.base(); end >= 0 && base >= 0 {
				c.m.committedLag.WithLabelValues(c.cfg.Topic, part).Set(float64(max(end-base, 0)))
			}
			c.m.oldestUnacked.WithLabelValues(c.cfg.Topic, part).Set(age)
			// Add(0) makes the series exist at 0 for every owned partition
			// (an alert or dashboard then sees "not paused" rather than
			// nothing) without clearing a pause in progress.
			c.m.paused.WithLabelValues(c.cfg.Topic, part).Add(0)
		})
	}
}

// endPartitions deletes the generation's per-partition series: the
// partitions may be another member's now, which reports them.
func (c *Consumer) endPartitions(g *genState) {
	for p, ps := range g.parts {
		l := []string{c.cfg.Topic, strconv.Itoa(p)}
		ps.end(func() {
			c.m.lag.DeleteLabelValues(l...)
			c.m.committedLag.DeleteLabelValues(l...)
			c.m.oldestUnacked.DeleteLabelValues(l...)
			c.m.paused.DeleteLabelValues(l...)
		})
	}
}
