package consumer

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// pipeline carries fetched records through batches to the processor: the
// batch loop cuts batches (BATCH_MAX_*) under MaxInflightBatches slots, the
// workers score them, and each batch's records of a partition are
// acknowledged in that partition's turn. It knows nothing of the group:
// records arrive on in with their generation and partition.
type pipeline struct {
	cfg  Config
	m    *metrics
	proc *processor
	// settle takes a record out of the in-flight accounting (see
	// Consumer.settle).
	settle func(r *record, ack bool)

	// in carries fetched records to the batch loop; unbuffered so a
	// fetcher holds at most one record while the pipeline is full.
	in chan *record
	// slots holds one token per batch between fetch and the end of its
	// scoring; work hands flushed batches to the workers and never blocks
	// because of slots.
	slots chan struct{}
	work  chan *batch
	// wg counts the pipeline's goroutines: batch loop, workers and the
	// partitions' turns being (or waiting to be) acknowledged.
	wg sync.WaitGroup
	// acking holds when each turn being acknowledged began (its results
	// and dead letters written, and retried until the sink acknowledges
	// them), for Consumer.OldestAcknowledgement.
	ackMu  sync.Mutex
	acking map[*turn]time.Time
	// batches counts flushed batches by the rule that ended them.
	batches [numTriggers]atomic.Uint64
}

func newPipeline(cfg Config, m *metrics, proc *processor, settle func(*record, bool)) *pipeline {
	return &pipeline{
		cfg: cfg, m: m, proc: proc, settle: settle,
		in:    make(chan *record),
		slots: make(chan struct{}, cfg.MaxInflightBatches),
		work:  make(chan *batch, cfg.MaxInflightBatches),
	}
}

// oldestAcknowledgement is how long the longest acknowledgement going on
// has run (0: none).
func (pl *pipeline) oldestAcknowledgement() time.Duration {
	pl.ackMu.Lock()
	defer pl.ackMu.Unlock()
	var oldest time.Duration
	for _, at := range pl.acking {
		oldest = max(oldest, time.Since(at))
	}
	return oldest
}

// batchLoop owns the Batcher: it takes a batch slot before it starts a
// batch (so a batch is only built when a worker will be able to take it),
// fills it from the fetchers and hands it to the workers when a rule fires.
func (pl *pipeline) batchLoop(ctx context.Context) {
	b := NewBatcher(BatchPolicy{
		MaxMessages: pl.cfg.BatchMaxMessages,
		MaxBytes:    pl.cfg.BatchMaxBytes,
		MaxWait:     pl.cfg.BatchMaxWait,
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
		pl.batches[why].Add(1)
		pl.m.batchSize.Observe(float64(len(recs)))
		pl.work <- sequence(recs) // never blocks: at most cap(slots) batches hold a slot
	}
	defer func() {
		// Abandoned on shutdown: never acknowledged, so never committed.
		batch, _ := b.Flush()
		if held != nil {
			batch = append(batch, held)
		}
		for _, r := range batch {
			pl.settle(r, false)
		}
	}()
	for {
		if !haveSlot {
			select {
			case pl.slots <- struct{}{}:
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
		case r := <-pl.in:
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
			r.ps.turns.Add(1)
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
func (pl *pipeline) finish(t *turn) {
	for _, r := range t.recs {
		pl.settle(r, false) // no-op for acknowledged records
	}
	close(t.done)
	t.ps.turns.Add(-1)
}

// start starts the batch loop and the workers under ctx. The
// returned func waits, once ctx has ended, until they (and batches waiting
// for their turn) stopped or deadline passed, and then settles the batches
// still queued for the workers (they exit without taking them), so the
// in-flight count returns to zero.
func (pl *pipeline) start(ctx context.Context) (wait func(deadline time.Time) bool) {
	pl.wg.Go(func() { pl.batchLoop(ctx) })
	for range pl.cfg.MaxInflightBatches {
		pl.wg.Go(func() { pl.worker(ctx) })
	}
	return func(deadline time.Time) bool {
		ok := waitUntil(&pl.wg, deadline)
		pl.settleQueued()
		return ok
	}
}

// settleQueued takes the batches left in the work channel out of the
// in-flight accounting, unacknowledged: they are redelivered.
func (pl *pipeline) settleQueued() {
	for {
		select {
		case b := <-pl.work:
			for _, t := range b.turns {
				pl.finish(t)
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
// records, or twice MaxInflightBatches of its batches, are in flight (see
// waitSpan).
func (pl *pipeline) worker(ctx context.Context) {
	for {
		select {
		case b := <-pl.work:
			out := pl.proc.prepare(b.recs)
			for _, t := range b.turns {
				part := out.of(t)
				pl.wg.Go(func() {
					t.await()
					pl.acknowledgeTurn(t, part)
					pl.finish(t)
				})
			}
			<-pl.slots
		case <-ctx.Done():
			return
		}
	}
}

// acknowledgeTurn is acknowledge for t's prepared records, timed for
// OldestAcknowledgement.
func (pl *pipeline) acknowledgeTurn(t *turn, p prepared) {
	pl.ackMu.Lock()
	if pl.acking == nil {
		pl.acking = map[*turn]time.Time{}
	}
	pl.acking[t] = time.Now()
	pl.ackMu.Unlock()
	defer func() {
		pl.ackMu.Lock()
		delete(pl.acking, t)
		pl.ackMu.Unlock()
	}()
	pl.proc.acknowledge(p)
}
