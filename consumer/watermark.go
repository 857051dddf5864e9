package consumer

import (
	"fmt"
	"sync"
	"time"
)

// Watermark tracks the offsets of one partition in one group generation and
// says which offset is safe to commit. Offsets are tracked in fetch order and
// may be resolved in any order; Committable never moves past an offset that
// is tracked but not yet resolved, so a commit can never skip unfinished
// work. It is modelled on Jeffail/checkpoint's capped checkpointer, the cap
// left to its caller: the consumer's fetcher pauses a partition while the
// records tracked past its last successful commit (Tracked minus the
// Checkpoint count that commit wrote) reach MaxUncommitted, counting
// records, not offsets, because real topics have gaps (aborted
// transactions, compaction, retention).
//
// A Watermark is safe for concurrent use. Create one per partition per
// generation and drop it when the generation ends, so that work finishing
// after a revocation resolves an orphaned Watermark and is never committed.
type Watermark struct {
	mu sync.Mutex
	// entries holds tracked offsets from the oldest unresolved one onwards;
	// popped counts entries already removed from the front, so that entry
	// with sequence number s lives at entries[s-popped].
	entries []wmEntry
	popped  int64
	// next is the committable offset: one past the last offset of the
	// resolved prefix. Valid once advanced is true.
	next     int64
	advanced bool
	// last is the highest tracked offset, to reject out-of-order tracking.
	last    int64
	tracked bool
	// pending counts tracked offsets not yet resolved.
	pending int
}

type wmEntry struct {
	offset int64
	done   bool
	at     time.Time // when it was tracked, for the oldest-unacknowledged age
}

// NewWatermark returns an empty Watermark.
func NewWatermark() *Watermark {
	return &Watermark{}
}

// Track registers offset as in flight and returns the func that resolves it.
// Offsets must be tracked in strictly increasing order (gaps are fine: a
// compacted topic, an aborted transaction or a retention reset skips
// offsets). The returned func is idempotent and safe
// to call from any goroutine.
func (w *Watermark) Track(offset int64) (done func(), err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.tracked && offset <= w.last {
		return nil, fmt.Errorf("consumer: watermark: offset %d tracked after %d", offset, w.last)
	}
	w.tracked, w.last = true, offset
	seq := w.popped + int64(len(w.entries))
	w.entries = append(w.entries, wmEntry{offset: offset, at: time.Now()})
	w.pending++
	var once sync.Once
	return func() { once.Do(func() { w.resolve(seq) }) }, nil
}

// resolve marks entry seq done and pops the resolved prefix.
func (w *Watermark) resolve(seq int64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.entries[seq-w.popped].done = true
	w.pending--
	n := 0
	for n < len(w.entries) && w.entries[n].done {
		n++
	}
	if n == 0 {
		return
	}
	w.next, w.advanced = w.entries[n-1].offset+1, true
	// Copy the tail down rather than reslicing, so the backing array does
	// not grow without bound on a long-lived partition.
	rest := copy(w.entries, w.entries[n:])
	clear(w.entries[rest:])
	w.entries = w.entries[:rest]
	w.popped += int64(n)
}

// Committable returns the offset to commit: the last offset of the
// contiguous resolved prefix plus one, as Kafka expects the next offset to
// read. ok is false while nothing has been resolved from the start, so there
// is nothing new to commit.
func (w *Watermark) Committable() (next int64, ok bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.next, w.advanced
}

// Checkpoint is Committable with the number of tracked offsets before next
// (the resolved prefix), read together: once next is committed, that many
// records need no replay, and Tracked minus it is what a crash would
// replay.
func (w *Watermark) Checkpoint() (next, before int64, ok bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.next, w.popped, w.advanced
}

// Tracked returns how many offsets were tracked in all.
func (w *Watermark) Tracked() int64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.popped + int64(len(w.entries))
}

// Pending returns how many tracked offsets are not yet resolved: the
// records in flight, counted rather than measured as an offset distance
// because offsets have gaps.
func (w *Watermark) Pending() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.pending
}

// Oldest returns when the oldest unresolved offset was tracked; ok is false
// when none is pending. After the resolved prefix is popped the first entry
// is always unresolved, so this is O(1).
func (w *Watermark) Oldest() (at time.Time, ok bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.entries) == 0 {
		return time.Time{}, false
	}
	return w.entries[0].at, true
}

// Rewind lets offsets from offset on be tracked again: the partition's log
// was rewound under its reader (truncated by an unclean leader election, or
// the topic deleted and re-created), so the records now at those offsets
// are new ones, not repeats. The entries still tracked at or past offset
// are records the log no longer holds: resolving them moves Committable to
// offset at most, never past the new records there, and a resolved prefix
// already past offset is pulled back to it. Committable may therefore go
// below an offset already committed, and that lower commit is the point:
// left at the old position, a crash or a rebalance would resume past the
// new records. The counts (Tracked, Pending, Checkpoint's) go on: what was
// tracked before the rewind was fetched all the same.
func (w *Watermark) Rewind(offset int64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for i := range w.entries {
		w.entries[i].offset = min(w.entries[i].offset, offset-1)
	}
	if w.advanced {
		w.next = min(w.next, offset)
	}
	if w.tracked {
		w.last = min(w.last, offset-1)
	}
}

// ResetTo is Rewind to offset for a read position reset there (the log cut
// back below it, or retention past it), and, with nothing in flight, makes
// offset committable at once: the partition may be idle, and with nothing
// tracked or resolved in this generation there would be no offset to commit
// until a record arrives, the old position staying committed meanwhile.
func (w *Watermark) ResetTo(offset int64) {
	w.Rewind(offset)
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.entries) == 0 {
		w.next, w.advanced = offset, true
	}
}
