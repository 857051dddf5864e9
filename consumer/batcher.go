package consumer

import (
	"fmt"
	"time"
)

// Trigger names the rule that ended a batch, so metrics and tests can tell
// a full batch from a timed-out one.
type Trigger int

// The rules that can end a batch.
const (
	// TriggerNone: the batch has not been told to flush by any rule.
	TriggerNone Trigger = iota
	// TriggerCount: the batch reached BatchMaxMessages.
	TriggerCount
	// TriggerBytes: the batch reached BatchMaxBytes, or the next message
	// would have pushed it over (see WouldOverflow).
	TriggerBytes
	// TriggerPeriod: the oldest message waited BatchMaxWait.
	TriggerPeriod
	// TriggerForced: the owner flushed for its own reason (shutdown).
	TriggerForced
	numTriggers
)

// String returns the trigger's metric label.
func (t Trigger) String() string {
	switch t {
	case TriggerNone:
		return "none"
	case TriggerCount:
		return "count"
	case TriggerBytes:
		return "bytes"
	case TriggerPeriod:
		return "period"
	case TriggerForced:
		return "forced"
	}
	return fmt.Sprintf("trigger(%d)", int(t))
}

// BatchPolicy bounds one batch. Zero or negative MaxBytes or MaxWait turns
// that bound off; MaxMessages must be at least 1.
type BatchPolicy struct {
	MaxMessages int
	MaxBytes    int
	MaxWait     time.Duration
}

// Batcher accumulates messages into one batch under a BatchPolicy. Like
// benthos's batch policy it is a passive object with no goroutine and no
// lock: the owning loop calls Add, WouldOverflow and Flush, and uses
// UntilNext to arm its timer. Not safe for concurrent use.
type Batcher[T any] struct {
	pol    BatchPolicy
	size   func(T) int
	now    func() time.Time
	items  []T
	bytes  int
	oldest time.Time
	// pending is the rule that asked for the current batch to flush;
	// counts tallies the rule behind each Flush.
	pending Trigger
	counts  [numTriggers]uint64
}

// NewBatcher returns a Batcher for pol that measures a message with size.
func NewBatcher[T any](pol BatchPolicy, size func(T) int) *Batcher[T] {
	return &Batcher[T]{pol: pol, size: size, now: time.Now}
}

// Len returns the number of messages in the current batch.
func (b *Batcher[T]) Len() int { return len(b.items) }

// Bytes returns the summed size of the current batch.
func (b *Batcher[T]) Bytes() int { return b.bytes }

// WouldOverflow reports whether adding m would push a non-empty batch over
// MaxBytes. The owner must then Flush before Add, which is how the byte bound
// is never exceeded. An empty batch never overflows: a message larger than
// MaxBytes on its own becomes a batch of its own (Add then asks for a flush).
func (b *Batcher[T]) WouldOverflow(m T) bool {
	if b.pol.MaxBytes <= 0 || len(b.items) == 0 {
		return false
	}
	if b.bytes+b.size(m) > b.pol.MaxBytes {
		b.pending = TriggerBytes
		return true
	}
	return false
}

// Add appends m and reports whether the batch should be flushed now: it
// reached MaxMessages or MaxBytes, or its oldest message has waited MaxWait.
// Call WouldOverflow first; Add does not refuse a message.
func (b *Batcher[T]) Add(m T) (flushNow bool) {
	now := b.now()
	if len(b.items) == 0 {
		b.oldest = now
	}
	b.items = append(b.items, m)
	b.bytes += b.size(m)
	switch {
	case len(b.items) >= b.pol.MaxMessages:
		b.pending = TriggerCount
	case b.pol.MaxBytes > 0 && b.bytes >= b.pol.MaxBytes:
		b.pending = TriggerBytes
	case b.pol.MaxWait > 0 && now.Sub(b.oldest) >= b.pol.MaxWait:
		b.pending = TriggerPeriod
	default:
		return false
	}
	return true
}

// UntilNext returns how long after now the current batch must be flushed
// because of MaxWait, measured from its oldest message: zero if overdue, and
// a negative duration when no timer is needed (empty batch or no MaxWait).
func (b *Batcher[T]) UntilNext(now time.Time) time.Duration {
	if len(b.items) == 0 || b.pol.MaxWait <= 0 {
		return -1
	}
	d := b.oldest.Add(b.pol.MaxWait).Sub(now)
	if d <= 0 {
		b.pending = TriggerPeriod
		return 0
	}
	return d
}

// Flush empties the batch and returns its messages (nil if empty) and the
// rule that ended it; TriggerForced when no rule had fired.
func (b *Batcher[T]) Flush() ([]T, Trigger) {
	if len(b.items) == 0 {
		return nil, TriggerNone
	}
	out, why := b.items, b.pending
	if why == TriggerNone {
		why = TriggerForced
	}
	b.counts[why]++
	b.items, b.bytes, b.pending = nil, 0, TriggerNone
	return out, why
}

// Triggers returns how many batches each rule ended so far, by Trigger.
func (b *Batcher[T]) Triggers() map[Trigger]uint64 {
	m := make(map[Trigger]uint64, numTriggers)
	for t, n := range b.counts {
		if n > 0 {
			m[Trigger(t)] = n
		}
	}
	return m
}
