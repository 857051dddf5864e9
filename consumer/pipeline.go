package consumer

import (
	"context"
	"time"
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
