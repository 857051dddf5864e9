package gpupool

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/scorer/scorer/model"
)

// callState is the calls' side of the pool, guarded by Pool.mu: the
// queue, the capacity it holds, and what runs now.
type callState struct {
	queue    *queue // batches waiting for a worker
	admitted int    // pairs queued or running: the QueueCapacity bound
	inflight int    // batches taken by workers and not yet settled
	// running holds when each batch on an engine right now began its run,
	// for Stats.OldestRun.
	running map[*batch]time.Time
	work    chan struct{} // closed and replaced to wake workers
	space   chan struct{} // closed and replaced to wake callers waiting for capacity
	// maxPairLen is the longest pair the engines accept (0: unknown); set
	// by New before any call.
	maxPairLen int
}

// request is one ScorePairs call.
type request struct {
	ctx       context.Context
	pairs     []model.Pair
	out       []float32
	remaining int           // pairs not yet scored; guarded by Pool.mu
	finished  bool          // done is closed; guarded by Pool.mu
	err       error         // set before done closes
	done      chan struct{} // closed when every pair is scored or the call failed
}

// batch is a set of a request's pairs run together.
type batch struct {
	req      *request
	idx      []int // indices into req.pairs, shortest first
	attempts int   // failed runs of this batch and the batches it was split from
	refusals int   // admission refusals since it was last split or moved
	avoid    []int // device slots this batch must not run on again
	lastErr  error // the latest run failure, for the error a failed call gets
	// refusedSince is its first refusal since it was last split or moved.
	refusedSince time.Time
}

// ScorePairs scores pairs and returns one score per pair in input order; it
// implements the transcript fan-out's PairScorer (internal/fanout). The pairs are sorted by length and packed
// into batches under MaxBatchTokens and MaxBatchRows, queued, and run by
// whichever device workers are idle. While the pool holds its queue
// capacity (32768 pairs queued or running), ScorePairs waits for room. When ctx ends, the call's queued batches
// are removed and its running ones cancelled, and ctx's error is returned.
// After Close it returns ErrPoolClosed. Pairs no engine could run (empty,
// type IDs not matching IDs, longer than the model's maximum length) fail
// the call at once with ErrInvalidInput, before anything is queued. Every
// pair is scored or the call fails: a batch is never silently dropped.
func (p *Pool) ScorePairs(ctx context.Context, pairs []model.Pair) ([]float32, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	p.mu.Lock()
	closed := p.closed
	p.mu.Unlock()
	if closed {
		return nil, ErrPoolClosed
	}
	if err := validatePairs(pairs, p.maxPairLen); err != nil {
		return nil, err
	}
	if len(pairs) == 0 {
		return []float32{}, nil
	}
	req := &request{ctx: ctx, pairs: pairs, out: make([]float32, len(pairs)), remaining: len(pairs), done: make(chan struct{})}
	// The planner counts one more batch as costing a 32nd of the token
	// budget in padding, of the shape the pool runs: it then cuts each
	// call's length-sorted pairs into few, nearly unpadded batches.
	overhead := max(1, p.cfg.maxBatchTokens/32)
	for _, idx := range planBatches(pairs, p.cfg.maxBatchTokens, p.cfg.maxBatchRows, overhead, p.rowCapFunc(), p.padFunc()) {
		if err := p.enqueue(req, &batch{req: req, idx: idx}); err != nil {
			return nil, err
		}
	}
	select {
	case <-req.done:
	case <-ctx.Done():
		p.mu.Lock()
		p.failLocked(req, ctx.Err())
		p.mu.Unlock()
		<-req.done // closed by failLocked or just before it
	}
	if req.err != nil {
		return nil, req.err
	}
	return req.out, nil
}

// validatePairs rejects, with ErrInvalidInput, what every engine would
// reject (the same checks as model.Session's), so such a call fails at once
// instead of walking across the devices as if they were broken. maxLen 0
// skips the length check.
func validatePairs(pairs []model.Pair, maxLen int) error {
	for i, pr := range pairs {
		switch {
		case len(pr.IDs) == 0:
			return fmt.Errorf("%w: pair %d is empty", ErrInvalidInput, i)
		case pr.TypeIDs != nil && len(pr.TypeIDs) != len(pr.IDs):
			return fmt.Errorf("%w: pair %d has %d ids but %d type ids", ErrInvalidInput, i, len(pr.IDs), len(pr.TypeIDs))
		case maxLen > 0 && len(pr.IDs) > maxLen:
			return fmt.Errorf("%w: pair %d has %d tokens, max length is %d", ErrInvalidInput, i, len(pr.IDs), maxLen)
		}
	}
	return nil
}

// isInvalidInput reports whether an engine's error says the input itself is
// bad, which no retry or other device can fix.
func isInvalidInput(err error) bool {
	return errors.Is(err, ErrInvalidInput) || errors.Is(err, model.ErrInvalidInput)
}

// enqueue adds b at the back of the queue, waiting while the pool is full.
// On ctx's end or Close it fails the whole request and returns the reason.
func (p *Pool) enqueue(req *request, b *batch) error {
	n := len(b.idx)
	p.mu.Lock()
	defer p.mu.Unlock()
	for {
		if req.finished {
			return req.err
		}
		if p.closed {
			p.failLocked(req, ErrPoolClosed)
			return ErrPoolClosed
		}
		if p.admitted+n <= p.cfg.queueCapacity {
			break
		}
		space := p.space
		p.mu.Unlock()
		select {
		case <-space:
		case <-req.ctx.Done():
		}
		p.mu.Lock()
		if err := req.ctx.Err(); err != nil {
			p.failLocked(req, err)
			return err
		}
	}
	p.admitted += n
	p.pushLocked(b, false)
	// Every device may already be degraded: fail or fall back now rather
	// than leave the batch to wait for nobody.
	p.reconcileLocked()
	return nil
}

// pushLocked queues b: at the back for new work, at the front for retries,
// which already waited their turn once.
func (p *Pool) pushLocked(b *batch, front bool) {
	if front {
		p.queue.pushFront(b)
	} else {
		p.queue.push(b)
	}
	p.wakeWorkersLocked()
}

func (p *Pool) wakeWorkersLocked() {
	close(p.work)
	p.work = make(chan struct{})
}

// releaseLocked returns n pairs of capacity and wakes callers waiting for it.
func (p *Pool) releaseLocked(n int) {
	p.admitted -= n
	close(p.space)
	p.space = make(chan struct{})
}

// failLocked ends req with err (the first error wins), removing its queued
// batches. Its running batches notice req.finished when they return.
func (p *Pool) failLocked(req *request, err error) {
	if req.finished {
		return
	}
	req.finished = true
	req.err = err
	for _, b := range p.queue.remove(func(b *batch) bool { return b.req == req }) {
		p.releaseLocked(len(b.idx))
	}
	close(req.done)
	p.wakeWorkersLocked() // Close may be waiting for an empty queue
}

// dropFinishedLocked removes the queued batches whose call already ended,
// returning their capacity.
func (p *Pool) dropFinishedLocked() {
	for _, b := range p.queue.dropFinished() {
		p.releaseLocked(len(b.idx))
		p.stats.Dropped++
	}
}
