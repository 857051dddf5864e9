package gpupool

import (
	"slices"

	"github.com/prometheus/client_golang/prometheus"
)

// queue holds the batches waiting for a worker and how many pairs they
// hold: new work at the back, retries at the front (they waited their turn
// once already), each taken by the first idle worker allowed to run it. It
// knows batches and their calls, not devices: which worker may take what
// is the Pool's policy, handed to take as a predicate, as
// text-embeddings-inference keeps its queue apart from its backends
// (core/src/queue.rs). Not safe for concurrent use: the Pool's mutex guards
// it, and the Pool settles the capacity of every batch it removes.
type queue struct {
	batches []*batch
	pairs   int              // pairs in batches
	depth   prometheus.Gauge // scorer_queue_depth_pairs: pairs
}

func newQueue(depth prometheus.Gauge) *queue { return &queue{depth: depth} }

// push adds new work at the back.
func (q *queue) push(b *batch) {
	q.batches = append(q.batches, b)
	q.added(b)
}

// pushFront adds a retry (a split half, a batch moved off a device) at the
// front.
func (q *queue) pushFront(b *batch) {
	q.batches = slices.Insert(q.batches, 0, b)
	q.added(b)
}

func (q *queue) added(b *batch) {
	q.pairs += len(b.idx)
	q.depth.Set(float64(q.pairs))
}

// take removes and returns the first batch may accepts, in queue order.
func (q *queue) take(may func(*batch) bool) (*batch, bool) {
	i := slices.IndexFunc(q.batches, may)
	if i < 0 {
		return nil, false
	}
	b := q.batches[i]
	q.batches = slices.Delete(q.batches, i, i+1)
	q.removed(b)
	return b, true
}

// dropFinished removes the batches whose call already ended (cancelled or
// failed) and returns them: no device should spend time on them.
func (q *queue) dropFinished() []*batch {
	return q.remove(func(b *batch) bool { return b.req.finished })
}

// remove removes every batch del accepts and returns them, in queue order.
func (q *queue) remove(del func(*batch) bool) []*batch {
	var out []*batch
	q.batches = slices.DeleteFunc(q.batches, func(b *batch) bool {
		if !del(b) {
			return false
		}
		out = append(out, b)
		q.removed(b)
		return true
	})
	return out
}

func (q *queue) removed(b *batch) {
	q.pairs -= len(b.idx)
	q.depth.Set(float64(q.pairs))
}

// len is the number of queued batches.
func (q *queue) len() int { return len(q.batches) }

// snapshot is the queued batches in order, a copy the caller may walk
// while it changes the queue.
func (q *queue) snapshot() []*batch { return slices.Clone(q.batches) }
