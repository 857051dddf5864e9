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

// batch is a flushed batch: its records and, for each input partition it
// holds records of, that partition's turn.
type batch struct {
	recs  []*record
	turns []*turn
}

// turn is a batch's records of one partition (of one generation) and their
// place in that partition's acknowledgement order: they may be published or
// dead-lettered once prev is closed (the partition's previous batch
// finished), and done is closed when they are finished themselves,
// acknowledged or abandoned. This is what keeps results in input-offset
// order per partition while batches are scored side by side: a later
// version of a call is never written before an earlier one, so an upsert
// sink keeps the newest. Turns of different partitions never wait for each
// other, so a record that cannot be written holds its own partition only.
type turn struct {
	g    *genState
	ps   *partState
	recs []*record
	prev <-chan struct{}
	done chan struct{}
}

// sequence splits recs into a turn per partition (of each generation),
// each after the partition's previous turn. Only the batch loop calls it,
// so partState.tail needs no lock; turns are handed out in dispatch order,
// so a turn only ever waits for earlier ones and the waits cannot form a
// cycle.
func sequence(recs []*record) *batch {
	b := &batch{recs: recs}
	byPart := map[*partState]*turn{}
	for _, r := range recs {
		t := byPart[r.ps]
		if t == nil {
			t = &turn{g: r.gen, ps: r.ps, prev: r.ps.tail, done: make(chan struct{})}
			r.ps.tail = t.done
			byPart[r.ps] = t
			b.turns = append(b.turns, t)
		}
		t.recs = append(t.recs, r)
	}
	return b
}

// await waits until t may acknowledge: the partition's previous turn
// finished, or the generation owning the partition ended (its records are
// then abandoned, not acknowledged).
func (t *turn) await() {
	select {
	case <-t.prev:
	case <-t.g.ctx.Done():
	}
}

// finish takes t's records that were not acknowledged out of the in-flight
// accounting (they are redelivered) and lets the partition's next turn go
// on.
func (c *Consumer) finish(t *turn) {
	for _, r := range t.recs {
		c.settle(r, false) // no-op for acknowledged records
	}
	close(t.done)
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
			for _, t := range b.turns {
				c.finish(t)
			}
		default:
			return
		}
	}
}

// worker decodes and scores batches one at a time and frees each batch's
// slot once it is scored. Each partition's part of the batch is then
// acknowledged (its results published, its dead letters written) in its
// turn, in a goroutine of its own: inference goes on with the next batch
// meanwhile, and a partition whose records cannot be written yet holds
// only its own turns. What waits that way is bounded per partition, not
// per batch: a partition's fetching pauses once MaxUncommitted of its
// records are in flight (see waitSpan).
func (c *Consumer) worker(ctx context.Context) {
	for {
		select {
		case b := <-c.work:
			out := c.proc.prepare(b.recs)
			for _, t := range b.turns {
				part := out.of(t)
				c.pipe.Go(func() {
					t.await()
					c.acknowledgeTurn(t, part)
					c.finish(t)
				})
			}
			<-c.slots
		case <-ctx.Done():
			return
		}
	}
}

// acknowledgeTurn is acknowledge for t's prepared records, timed for
// OldestAcknowledgement.
func (c *Consumer) acknowledgeTurn(t *turn, p prepared) {
	c.ackMu.Lock()
	if c.acking == nil {
		c.acking = map[*turn]time.Time{}
	}
	c.acking[t] = time.Now()
	c.ackMu.Unlock()
	defer func() {
		c.ackMu.Lock()
		delete(c.acking, t)
		c.ackMu.Unlock()
	}()
	c.proc.acknowledge(p)
}
