package consumer

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"strings"
	"time"

	"github.com/scorer/scorer/schema"
)

// DLQ reasons the consumer itself assigns (decode failures use
// schema.Reason's names).
const (
	ReasonTooLarge       = "too_large"
	ReasonScoreFailed    = "score_failed"
	ReasonOutputTooLarge = "output_too_large"
	ReasonOutputRejected = "output_rejected"
)

// batchLoop owns the Batcher: it takes a batch slot before it starts a
// batch (so a batch is only built when a worker will be able to take it),
// fills it from the fetchers and hands it to the workers when a rule fires.
func (c *Consumer) batchLoop(ctx context.Context) {
	b := NewBatcher(BatchPolicy{
		MaxMessages: c.cfg.BatchMaxMessages,
		MaxBytes:    c.cfg.BatchMaxBytes,
		MaxWait:     c.cfg.BatchMaxWait,
	}, func(r *record) int { return len(r.msg.Value) })
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	haveSlot := false
	var held *record // a record that overflowed the previous batch
	dispatch := func() {
		recs, why := b.Flush()
		if recs == nil {
			return
		}
		haveSlot = false
		c.batches[why].Add(1)
		c.m.batchSize.Observe(float64(len(recs)))
		c.work <- sequence(recs) // never blocks: at most cap(slots) batches hold a slot
	}
	defer func() {
		// Abandoned on shutdown: never acknowledged, so never committed.
		batch, _ := b.Flush()
		if held != nil {
			batch = append(batch, held)
		}
		for _, r := range batch {
			c.settle(r, false)
		}
	}()
	for {
		if !haveSlot {
			select {
			case c.slots <- struct{}{}:
				haveSlot = true
			case <-ctx.Done():
				return
			}
		}
		if held != nil {
			r := held
			held = nil
			if b.Add(r) {
				dispatch()
			}
			continue
		}
		var tc <-chan time.Time
		if d := b.UntilNext(time.Now()); d >= 0 {
			timer.Reset(d)
			tc = timer.C
		}
		select {
		case r := <-c.in:
			if b.WouldOverflow(r) {
				dispatch()
				held = r
			} else if b.Add(r) {
				dispatch()
			}
		case <-tc:
			if b.UntilNext(time.Now()) == 0 {
				dispatch()
			}
		case <-ctx.Done():
			timer.Stop()
			return
		}
		timer.Stop()
	}
}

// batch is a flushed batch and its place in the acknowledgement order of
// each input partition it holds records of.
type batch struct {
	recs  []*record
	turns []turn
}

// turn is a batch's place in one partition's acknowledgement order: the
// batch may publish or dead-letter records of that partition once prev is
// closed (the previous batch of the partition finished), and it closes done
// when it has finished itself, acknowledged or abandoned. This is what keeps
// results in input-offset order per partition while batches are scored side
// by side: a later version of a call is never written before an earlier
// one, so an upsert sink keeps the newest.
type turn struct {
	g    *genState
	prev <-chan struct{}
	done chan struct{}
}

// sequence gives recs a turn in each partition (of each generation) they
// belong to, after the partition's previous batch. Only the batch loop
// calls it, so partState.tail needs no lock; turns are handed out in
// dispatch order, so a batch only ever waits for earlier batches and the
// waits cannot form a cycle.
func sequence(recs []*record) *batch {
	b := &batch{recs: recs}
	seen := map[*partState]bool{}
	for _, r := range recs {
		if seen[r.ps] {
			continue
		}
		seen[r.ps] = true
		t := turn{g: r.gen, prev: r.ps.tail, done: make(chan struct{})}
		r.ps.tail = t.done
		b.turns = append(b.turns, t)
	}
	return b
}

// ready reports whether every earlier batch of b's partitions finished.
func (b *batch) ready() bool {
	for _, t := range b.turns {
		select {
		case <-t.prev:
		default:
			return false
		}
	}
	return true
}

// await waits until b may acknowledge: every earlier batch of its
// partitions finished, or the generation owning the partition ended (its
// records are then abandoned, not acknowledged).
func (b *batch) await() {
	for _, t := range b.turns {
		select {
		case <-t.prev:
		case <-t.g.ctx.Done():
		}
	}
}

// finish takes b's records that were not acknowledged out of the in-flight
// accounting (they are redelivered) and lets the next batches of its
// partitions go on.
func (c *Consumer) finish(b *batch) {
	for _, r := range b.recs {
		c.settle(r, false) // no-op for acknowledged records
	}
	for _, t := range b.turns {
		close(t.done)
	}
}

// startPipeline starts the batch loop and the workers under ctx. The
// returned func waits, once ctx has ended, until they (and batches waiting
// for their turn) stopped or deadline passed, and then settles the batches
// still queued for the workers (they exit without taking them), so the
// in-flight count returns to zero.
func (c *Consumer) startPipeline(ctx context.Context) (wait func(deadline time.Time) bool) {
	c.pipe.Go(func() { c.batchLoop(ctx) })
	for range c.cfg.MaxInflightBatches {
		c.pipe.Go(func() { c.worker(ctx) })
	}
	return func(deadline time.Time) bool {
		ok := waitUntil(&c.pipe, deadline)
		c.settleQueued()
		return ok
	}
}

// settleQueued takes the batches left in the work channel out of the
// in-flight accounting, unacknowledged: they are redelivered.
func (c *Consumer) settleQueued() {
	for {
		select {
		case b := <-c.work:
			c.finish(b)
		default:
			return
		}
	}
}

// worker decodes and scores batches one at a time, then acknowledges each
// (publishes its results, writes its dead letters) in its turn, and frees
// the batch's slot. A batch whose turn has not come yet (an earlier batch
// of one of its partitions is still publishing) waits in a goroutine of its
// own and frees its slot at once, so inference goes on with the next batch
// meanwhile. At most MaxInflightBatches batches wait that way (beyond, the
// worker waits itself, holding its slot), so batches in memory stay within
// twice MaxInflightBatches.
func (c *Consumer) worker(ctx context.Context) {
	for {
		select {
		case b := <-c.work:
			out := c.prepare(b.recs)
			if b.ready() || !c.tryWait() {
				b.await()
				c.acknowledgeBatch(b, out)
				c.finish(b)
			} else {
				c.pipe.Go(func() {
					defer func() { <-c.waiting }()
					b.await()
					c.acknowledgeBatch(b, out)
					c.finish(b)
				})
			}
			<-c.slots
		case <-ctx.Done():
			return
		}
	}
}

// tryWait takes a token for a batch to wait for its turn off the worker;
// false when MaxInflightBatches batches already wait.
func (c *Consumer) tryWait() bool {
	select {
	case c.waiting <- struct{}{}:
		return true
	default:
		return false
	}
}

// prepared is one generation's part of a batch, decoded and scored, ready
// to be acknowledged.
type prepared struct {
	g    *genState
	dead []deadRecord
	// out holds the results and deletes to write, in input-offset order.
	out []outItem
}

// outItem is one record's output: its result, or (res nil) a tombstone for
// the deleted call.
type outItem struct {
	r   *record
	res *schema.ScoredTranscript
	del schema.Delete
}

// prepare decodes and scores a batch. Its records normally belong to one
// generation; those of a revoked generation are dropped (the partition's
// new owner reads them again), and each generation's records are processed
// under that generation's context, which ends when it is revoked.
func (c *Consumer) prepare(batch []*record) []prepared {
	var out []prepared
	for len(batch) > 0 {
		g := batch[0].gen
		var mine, rest []*record
		for _, r := range batch {
			if r.gen == g {
				mine = append(mine, r)
			} else {
				rest = append(rest, r)
			}
		}
		if !g.revoked.Load() {
			if p, ok := c.prepareGen(g, mine); ok {
				out = append(out, p)
			}
		}
		batch = rest
	}
	return out
}

// acknowledgeBatch is acknowledge for b's prepared records, timed for
// OldestAcknowledgement.
func (c *Consumer) acknowledgeBatch(b *batch, out []prepared) {
	c.ackMu.Lock()
	if c.acking == nil {
		c.acking = map[*batch]time.Time{}
	}
	c.acking[b] = time.Now()
	c.ackMu.Unlock()
	defer func() {
		c.ackMu.Lock()
		delete(c.acking, b)
		c.ackMu.Unlock()
	}()
	c.acknowledge(out)
}

// acknowledge writes the prepared dead letters and results. A record is
// acknowledged (settled with ack) only once its result or dead letter was
// acknowledged by the sink; if the generation's context ends first it stays
// unacknowledged and is redelivered.
func (c *Consumer) acknowledge(out []prepared) {
	for _, p := range out {
		if p.g.revoked.Load() {
			continue
		}
		if !c.deadLetter(p.g.ctx, p.g, p.dead) {
			continue
		}
		// Runs of results and of deletes, in offset order, so that a
		// delete and a version of the same call keep their input order.
		for rest := p.out; len(rest) > 0 && !p.g.revoked.Load(); {
			n := 1
			for n < len(rest) && (rest[n].res == nil) == (rest[0].res == nil) {
				n++
			}
			run := rest[:n]
			rest = rest[n:]
			recs := make([]*record, len(run))
			for i, it := range run {
				recs[i] = it.r
			}
			if run[0].res == nil {
				dels := make([]schema.Delete, len(run))
				for i, it := range run {
					dels[i] = it.del
				}
				c.forwardDeletes(p.g.ctx, p.g, recs, dels)
				continue
			}
			results := make([]schema.ScoredTranscript, len(run))
			for i, it := range run {
				results[i] = *it.res
			}
			c.publish(p.g.ctx, p.g, recs, results)
		}
	}
}

// Deleter is the optional part of a Sink that forwards deletes: Delete
// writes a tombstone (a null value) for each deleted call on the output
// topic and returns once the broker acknowledged them (errors as for
// Publish).
// producer satisfies it. With a Sink that lacks it, deletes are
// dead-lettered (reason delete_unsupported).
type Deleter interface {
	Delete(ctx context.Context, dels []schema.Delete) error
}

// ReasonDeleteUnsupported is the DLQ reason of a delete (tombstone or
// Debezium op d) when the Sink cannot forward deletes.
const ReasonDeleteUnsupported = "delete_unsupported"

// forwardDeletes writes a tombstone for each call in dels, retrying
// transient failures until ctx ends like publish; a permanent failure
// dead-letters the records.
func (c *Consumer) forwardDeletes(ctx context.Context, g *genState, recs []*record, dels []schema.Delete) {
	del, ok := c.sink.(Deleter)
	if !ok {
		dead := make([]deadRecord, len(recs))
		for i, r := range recs {
			dead[i] = deadRecord{r, schema.StageProduce, ReasonDeleteUnsupported, "consumer.DeleteUnsupported",
				"the sink cannot write tombstones"}
		}
		c.deadLetter(ctx, g, dead)
		return
	}
	backoff := c.cfg.RetryBackoff
	for !g.revoked.Load() {
		err := del.Delete(ctx, dels)
		if err == nil {
			for _, r := range recs {
				c.m.tombstones.Inc()
				c.published.Add(1)
				c.settle(r, true)
			}
			return
		}
		if ctx.Err() != nil {
			return
		}
		if IsPermanent(err) {
			dead := make([]deadRecord, len(recs))
			for i, r := range recs {
				dead[i] = deadRecord{r, schema.StageProduce, ReasonOutputRejected, exceptionClass(err), err.Error()}
			}
			c.deadLetter(ctx, g, dead)
			return
		}
		c.log.Warn().Err(fmt.Errorf("consumer: delete: %w", err)).Int("records", len(recs)).Msg("tombstone write failed; retrying")
		if !sleepCtx(ctx, backoff) {
			return
		}
		backoff = min(backoff*2, c.cfg.RetryBackoffMax)
	}
}

// prepareGen decodes and scores one generation's records: the ones to
// dead-letter and the results to publish. ok is false if the generation's
// context ended before scoring finished (nothing is acknowledged then).
func (c *Consumer) prepareGen(g *genState, batch []*record) (p prepared, ok bool) {
	ctx := g.ctx
	p.g = g
	var (
		dead    []deadRecord
		events  []schema.TranscriptEvent
		scored  []*record
		deletes = map[*record]schema.Delete{}
	)
	for _, r := range batch {
		if len(r.msg.Value) > c.cfg.MaxMessageBytes {
			dead = append(dead, deadRecord{r, schema.StageDecode, ReasonTooLarge, "consumer.MessageTooLarge",
				fmt.Sprintf("record value is %d bytes, limit %d", len(r.msg.Value), c.cfg.MaxMessageBytes)})
			continue
		}
		ev, del, err := c.decodeGuarded(r.msg.Key, r.msg.Value)
		if err == nil && del != nil {
			deletes[r] = *del
			continue
		}
		if err != nil {
			reason, class := "decode_failed", exceptionClass(err)
			var de *schema.DecodeError
			if errors.As(err, &de) {
				reason, class = de.Reason.String(), "schema.DecodeError"
			}
			c.log.Debug().Int("partition", r.msg.Partition).Int64("offset", r.msg.Offset).Str("reason", reason).Msg("undecodable record")
			dead = append(dead, deadRecord{r, schema.StageDecode, reason, class, err.Error()})
			continue
		}
		events = append(events, ev)
		scored = append(scored, r)
	}
	res := map[*record]*schema.ScoredTranscript{}
	if len(events) > 0 {
		results, failed, ok := c.score(ctx, events)
		if !ok {
			return p, false
		}
		for i, r := range scored {
			if err := failed[i]; err != nil {
				dead = append(dead, deadRecord{r, schema.StageScore, ReasonScoreFailed, exceptionClass(err), err.Error()})
				continue
			}
			st := results[i]
			st.Source = &schema.Source{Topic: r.msg.Topic, Partition: r.msg.Partition, Offset: r.msg.Offset, Generation: g.id}
			res[r] = &st
		}
	}
	for _, r := range batch {
		if st, ok := res[r]; ok {
			p.out = append(p.out, outItem{r: r, res: st})
		} else if d, ok := deletes[r]; ok {
			p.out = append(p.out, outItem{r: r, del: d})
		}
	}
	p.dead = dead
	return p, true
}

type deadRecord struct {
	r                    *record
	stage, reason, class string
	message              string
}

// exceptionClass names err's type the way Connect's exception class header
// names a Java class: the Go type, without the pointer star.
func exceptionClass(err error) string {
	return strings.TrimPrefix(fmt.Sprintf("%T", err), "*")
}

// dlqLogInterval is the least time between two error lines about the same
// failing dead-letter write: loud, without flooding the log.
const dlqLogInterval = 5 * time.Second

// deadLetter writes the dead letters and acknowledges each record once the
// sink acknowledged its dead letter. Failures are retried with backoff
// until ctx ends or the generation is revoked, never dropped (dropping
// input silently is worse than holding the partition's commits back): a
// transient failure resends what is left; a permanent one resends only the
// records it names (FailedIndexes), because the sink acknowledged the
// others and resending them would duplicate them in the DLQ; a permanent
// one that names none resends each record on its own to find the failing
// ones. Every failure counts in scorer_dlq_write_errors_total and is logged
// at error level, at most once per dlqLogInterval. It reports false if it
// stopped before every dead letter was acknowledged.
func (c *Consumer) deadLetter(ctx context.Context, g *genState, dead []deadRecord) bool {
	backoff := c.cfg.RetryBackoff
	var lastLog time.Time
	failures := 0
	for len(dead) > 0 {
		if g.revoked.Load() {
			return false // the partition's new owner redoes them
		}
		err := c.sink.DeadLetter(ctx, deadLetters(dead))
		if err == nil {
			for _, d := range dead {
				c.ackDead(d)
			}
			return true
		}
		if ctx.Err() != nil {
			return false
		}
		kind := "transient"
		if IsPermanent(err) {
			kind = "permanent"
			failed := map[int]bool{}
			for _, i := range failedIndexes(err) {
				if i >= 0 && i < len(dead) {
					failed[i] = true
				}
			}
			if len(failed) == 0 && len(dead) > 1 {
				// The sink did not say which were written: find out one by
				// one (at worst a dead letter is written twice, never lost).
				c.m.dlqErrors.WithLabelValues(kind).Inc()
				c.log.Error().Err(fmt.Errorf("consumer: dead letter: %w", err)).Int("records", len(dead)).
					Msg("DLQ write failed permanently without naming the records; writing them one by one")
				for i := range dead {
					if !c.deadLetter(ctx, g, dead[i:i+1]) {
						return false
					}
				}
				return true
			}
			if len(failed) > 0 {
				var retry []deadRecord
				for i, d := range dead {
					if failed[i] {
						retry = append(retry, d)
					} else {
						c.ackDead(d)
					}
				}
				dead = retry
			}
		}
		failures++
		c.m.dlqErrors.WithLabelValues(kind).Inc()
		if now := time.Now(); now.Sub(lastLog) >= dlqLogInterval {
			lastLog = now
			offsets := make([]int64, len(dead))
			for i, d := range dead {
				offsets[i] = d.r.msg.Offset
			}
			c.log.Error().Err(fmt.Errorf("consumer: dead letter: %w", err)).Str("kind", kind).
				Int("partition", dead[0].r.msg.Partition).Ints64("offsets", offsets).Int("failures", failures).
				Dur("retry_in", backoff).Msg("DLQ write failed; retrying (commits of the partition wait for it)")
		}
		if !sleepCtx(ctx, backoff) {
			return false
		}
		backoff = min(backoff*2, c.cfg.RetryBackoffMax)
	}
	return true
}

// deadLetters builds the DLQ records: the original key, value, headers and
// timestamp plus where the record came from and why it failed.
func deadLetters(dead []deadRecord) []schema.DeadLetter {
	dls := make([]schema.DeadLetter, len(dead))
	for i, d := range dead {
		m := d.r.msg
		hs := make([]schema.Header, len(m.Headers))
		for j, h := range m.Headers {
			hs[j] = schema.Header{Key: h.Key, Value: h.Value}
		}
		dls[i] = schema.DeadLetter{
			Key: m.Key, Value: m.Value, Headers: hs, Timestamp: m.Time,
			Topic: m.Topic, Partition: m.Partition, Offset: m.Offset, Generation: d.r.gen.id,
			Stage: d.stage, Reason: d.reason, ExceptionClass: d.class, Message: d.message,
		}
	}
	return dls
}

// ackDead records that d's dead letter was acknowledged and acknowledges
// its record.
func (c *Consumer) ackDead(d deadRecord) {
	c.m.dlq.WithLabelValues(d.reason).Inc()
	c.deadLettered.Add(1)
	c.log.Info().Int("partition", d.r.msg.Partition).Int64("offset", d.r.msg.Offset).
		Str("stage", d.stage).Str("reason", d.reason).Msg("record dead-lettered")
	c.settle(d.r, true)
}

// score scores the events and returns one result per event; failed[i] is
// set for each event to dead-letter instead. ok is false if ctx ended
// first.
//
// The batch is scored with ScoreAttempts tries; if it keeps failing, its
// events are scored one by one. An event is dead-lettered only when its
// error is permanent (see permanentScoreError) or its failure is isolated:
// the scorer scored another event (the canary, normally one of this batch)
// after the failure. When everything fails alike the scorer is down (GPU
// lost or out of memory under contention, pool closed): the events are kept
// and retried in rounds with bounded exponential backoff, each round logged
// at error level, for as long as ctx lives — an outage must not turn the
// stream into dead letters.
func (c *Consumer) score(ctx context.Context, events []schema.TranscriptEvent) (results []schema.ScoredTranscript, failed map[int]error, ok bool) {
	results = make([]schema.ScoredTranscript, len(events))
	failed = map[int]error{}
	todo := make([]int, len(events)) // indexes of events still to score
	for i := range todo {
		todo[i] = i
	}
	backoff := c.cfg.RetryBackoff
	for round := 1; ; round++ {
		batch := make([]schema.TranscriptEvent, len(todo))
		for k, i := range todo {
			batch[k] = events[i]
		}
		res, err := c.scoreWithRetry(ctx, batch)
		if err == nil {
			for k, i := range todo {
				results[i] = res[k]
			}
			return results, failed, true
		}
		if ctx.Err() != nil {
			return nil, nil, false
		}
		// Already in an outage: probe before scoring events one by one.
		healthy := round == 1 || c.probe(ctx)
		var lastErr error
		if healthy {
			errs := map[int]error{}
			if len(todo) == 1 {
				errs[todo[0]] = err
			} else {
				c.log.Warn().Err(err).Int("events", len(todo)).Msg("batch scoring failed; scoring events one by one")
				for _, i := range todo {
					one, err := c.scoreWithRetry(ctx, events[i:i+1])
					if ctx.Err() != nil {
						return nil, nil, false
					}
					if err != nil {
						errs[i] = err
						continue
					}
					results[i] = one[0]
				}
			}
			var still []int
			for _, i := range todo {
				switch e := errs[i]; {
				case e == nil:
				case permanentScoreError(e):
					failed[i] = e
				default:
					still = append(still, i)
					lastErr = e
				}
			}
			todo = still
			if len(todo) == 0 {
				return results, failed, true
			}
			if c.probe(ctx) {
				// The scorer works: these events fail on their own.
				for _, i := range todo {
					failed[i] = errs[i]
				}
				return results, failed, true
			}
		}
		if ctx.Err() != nil {
			return nil, nil, false
		}
		if lastErr == nil {
			lastErr = err
		}
		c.m.outages.Inc()
		c.log.Error().Err(lastErr).Int("events", len(todo)).Int("round", round).Dur("retry_in", backoff).
			Msg("scorer fails for every event; keeping the batch and retrying (nothing is dead-lettered during an outage)")
		if !sleepCtx(ctx, backoff) {
			return nil, nil, false
		}
		backoff = min(backoff*2, c.cfg.OutageBackoffMax)
	}
}

// permanentScoreError reports whether a scoring error says the event itself
// is bad, so retrying cannot help: the error (or one it wraps) has a
// Permanent() method returning true — the contract for scorers' invalid-
// input errors — or it wraps schema.ErrInvalidEvent.
func permanentScoreError(err error) bool {
	return IsPermanent(err) || errors.Is(err, schema.ErrInvalidEvent)
}

// probe reports whether the scorer works right now: the canary event scores.
// With no canary yet there is no evidence either way, and it reports false.
func (c *Consumer) probe(ctx context.Context) bool {
	ev := c.canary.Load()
	if ev == nil {
		return false
	}
	_, err := c.scoreWithRetry(ctx, []schema.TranscriptEvent{*ev})
	return err == nil
}

// scoreWithRetry scores events with up to ScoreAttempts tries, stopping
// early on a permanent error. On success it keeps the call's smallest event
// as the canary.
func (c *Consumer) scoreWithRetry(ctx context.Context, events []schema.TranscriptEvent) ([]schema.ScoredTranscript, error) {
	backoff := c.cfg.RetryBackoff
	var err error
	for attempt := range c.cfg.ScoreAttempts {
		if attempt > 0 && !sleepCtx(ctx, backoff) {
			return nil, ctx.Err()
		}
		backoff = min(backoff*2, c.cfg.RetryBackoffMax)
		var res []schema.ScoredTranscript
		res, err = c.scoreGuarded(ctx, events)
		if err == nil && len(res) != len(events) {
			err = fmt.Errorf("scorer returned %d results for %d events", len(res), len(events))
		}
		if err == nil {
			small := 0
			for i := range events {
				if events[i].SentenceCount() < events[small].SentenceCount() {
					small = i
				}
			}
			ev := events[small]
			c.canary.Store(&ev)
			return res, nil
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if permanentScoreError(err) {
			break
		}
	}
	return nil, fmt.Errorf("consumer: score %d events: %w", len(events), err)
}

// publish writes the results, retrying transient failures until ctx ends
// (never dropping: an unacknowledged record is redelivered after restart).
// Records the sink rejects permanently are dead-lettered. It checks the
// generation right before every write: once revoked, the partition belongs
// to another member, which publishes these records itself.
func (c *Consumer) publish(ctx context.Context, g *genState, recs []*record, results []schema.ScoredTranscript) {
	backoff := c.cfg.RetryBackoff
	for len(recs) > 0 {
		if g.revoked.Load() {
			return
		}
		err := c.sink.Publish(ctx, results)
		if err == nil {
			now := time.Now()
			for _, r := range recs {
				c.m.endToEnd.Observe(now.Sub(r.msg.Time).Seconds())
				c.published.Add(1)
				c.settle(r, true)
			}
			return
		}
		if ctx.Err() != nil {
			return
		}
		if IsPermanent(err) {
			c.publishPermanent(ctx, g, recs, results, err)
			return
		}
		c.log.Warn().Err(fmt.Errorf("consumer: publish: %w", err)).Int("records", len(recs)).Msg("publish failed; retrying")
		if !sleepCtx(ctx, backoff) {
			return
		}
		backoff = min(backoff*2, c.cfg.RetryBackoffMax)
	}
}

// publishPermanent handles a permanent Publish error: the named records (or,
// when the error names none, each record found by publishing one at a time)
// go to the DLQ; the others are acknowledged or published again.
func (c *Consumer) publishPermanent(ctx context.Context, g *genState, recs []*record, results []schema.ScoredTranscript, err error) {
	reason := ReasonOutputRejected
	if isTooLarge(err) {
		reason = ReasonOutputTooLarge
	}
	idx := failedIndexes(err)
	if len(recs) == 1 {
		idx = []int{0}
	}
	if len(idx) == 0 {
		for i := range recs {
			c.publish(ctx, g, recs[i:i+1], results[i:i+1])
		}
		return
	}
	bad := map[int]bool{}
	for _, i := range idx {
		if i >= 0 && i < len(recs) {
			bad[i] = true
		}
	}
	var dead []deadRecord
	for i, r := range recs {
		if bad[i] {
			dead = append(dead, deadRecord{r, schema.StageProduce, reason, exceptionClass(err), err.Error()})
			continue
		}
		// The sink acknowledged every record it did not name.
		c.m.endToEnd.Observe(time.Since(r.msg.Time).Seconds())
		c.published.Add(1)
		c.settle(r, true)
	}
	c.deadLetter(ctx, g, dead)
}

// errPanic marks a failure that was a recovered panic: a bug met by one
// input. Recovering turns a crash loop on that record (it would never be
// committed) into a dead letter; the stack goes to the log at error level.
var errPanic = errors.New("panic")

// decodeGuarded is schema.DecodeRecord with a panic turned into an error,
// so one record that trips a decoder bug is dead-lettered, not a crash loop.
func (c *Consumer) decodeGuarded(key, value []byte) (ev schema.TranscriptEvent, del *schema.Delete, err error) {
	defer func() {
		if p := recover(); p != nil {
			c.log.Error().Str("stack", string(debug.Stack())).Msgf("decoder panicked: %v", p)
			err = fmt.Errorf("consumer: decoding: %w: %v", errPanic, p)
		}
	}()
	return schema.DecodeRecord(key, value, c.cfg.Limits)
}

// scoreGuarded is Scorer.Score with a panic turned into an error: the
// failure then goes through the same isolation as any other (the events
// that trip it are dead-lettered, the rest score).
func (c *Consumer) scoreGuarded(ctx context.Context, events []schema.TranscriptEvent) (res []schema.ScoredTranscript, err error) {
	defer func() {
		if p := recover(); p != nil {
			c.log.Error().Str("stack", string(debug.Stack())).Int("events", len(events)).Msgf("scorer panicked: %v", p)
			err = fmt.Errorf("consumer: scoring %d events: %w: %v", len(events), errPanic, p)
		}
	}()
	return c.scorer.Score(ctx, events)
}
