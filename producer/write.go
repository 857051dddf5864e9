package producer

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/scorer/scorer/internal/retry"
)

// Retry backoff bounds for the Producer's own retry loop (write).
const (
	retryBackoffMin = 50 * time.Millisecond
	retryBackoffMax = 2 * time.Second
)

// write sends msgs and waits for every ack, retrying transient failures
// message by message with backoff until ctx ends. Permanent failures are
// recorded in perm and their owners' remaining messages dropped. Messages
// covered by a batch-level rejection (see isBatchRejection) are resent at
// once, one per request, and only then declared permanent.
//
// Every attempt sends what is left in the order of msgs through one
// writer, so a partition's resent records go before the records behind
// them: when [0..9] is rejected whole and [10] is held back, 0..9 are
// resent alone and 10 follows, never the other way round (two versions of
// a call share a key, and so a partition).
func (p *Producer) write(ctx context.Context, msgs []outMsg, perm *permanent, callID func(int) string) error {
	// Jittered: many scorer replicas then do not retry in lockstep.
	backoff := retry.Jittered(retryBackoffMin, retryBackoffMax)
	for attempt := 1; len(msgs) > 0; attempt++ {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("producer: write: %w", err)
		}
		pending, transient, err := p.attempt(ctx, msgs, perm, callID)
		if err != nil {
			return err
		}
		msgs = dropOwners(pending, perm)
		if len(msgs) == 0 {
			return nil
		}
		if transient == nil {
			continue // only resends that need no backoff
		}
		p.log.Warn().Err(transient).Int("attempt", attempt).Int("messages", len(msgs)).
			Dur("backoff", backoff.Pause()).Msg("transient produce failure; retrying")
		if !backoff.Wait(ctx) {
			return fmt.Errorf("producer: write: %w (last error: %v)", ctx.Err(), transient)
		}
	}
	return nil
}

// attempt sends msgs once. It records permanent failures in perm and
// returns the messages still to send, in the order of msgs: those to retry
// after a backoff and those to resend at once (moved to a request of their
// own, or the rest of a call kafka-go refused up front). transient is the
// first transient error, nil when no message still pending needs a
// backoff. A non-nil err (fatal error or ctx ended) ends the write.
func (p *Producer) attempt(ctx context.Context, msgs []outMsg, perm *permanent, callID func(int) string) (pending []outMsg, transient, err error) {
	// Fresh Message values every attempt; the byte slices are never
	// modified (a request cut off by ctx may still be encoding them).
	batch := make([]kafka.Message, len(msgs))
	alone := make([]bool, len(msgs))
	for i := range msgs {
		batch[i], alone[i] = msgs[i].msg, msgs[i].alone
	}
	start := time.Now()
	werr := p.w.writeMessages(ctx, batch, alone)
	p.metrics.observe(time.Since(start))
	if werr == nil {
		p.metrics.count(msgs)
		return nil, nil, nil
	}
	if ctxErr := ctx.Err(); ctxErr != nil {
		return nil, nil, fmt.Errorf("producer: write: %w (last error: %v)", ctxErr, werr)
	}

	// rejected handles a permanent error for m: final when m was sent
	// alone, otherwise m is resent alone first.
	rejected := func(m outMsg, e error) {
		if !m.alone && isBatchRejection(e) {
			m.alone = true
			pending = append(pending, m)
			return
		}
		perm.add(m.owner, callID(m.owner), e)
	}
	// retried keeps the transient error only if a message that needs the
	// backoff is still pending once this attempt's permanent failures
	// dropped their owners' other messages.
	var retried []int
	var werrs kafka.WriteErrors
	var tooLarge kafka.MessageTooLargeError
	switch {
	case errors.As(werr, &werrs) && len(werrs) == len(msgs):
		var ok []outMsg
		for i, e := range werrs {
			if e == nil {
				ok = append(ok, msgs[i])
				continue
			}
			switch classifyFor(msgs[i].kind, e) {
			case classPermanent:
				rejected(msgs[i], e)
			case classFatal:
				p.metrics.count(ok)
				return nil, nil, fmt.Errorf("producer: write to %s: %w", msgs[i].msg.Topic, e)
			default:
				if transient == nil {
					transient = e
				}
				retried = append(retried, msgs[i].owner)
				pending = append(pending, msgs[i])
			}
		}
		p.metrics.count(ok)
	case errors.As(werr, &tooLarge):
		// kafka-go rejected the call up front and wrote nothing; drop the
		// offender and resend the rest at once (no backoff needed).
		idx := indexOf(msgs, tooLarge.Message)
		if idx < 0 {
			return nil, nil, fmt.Errorf("producer: write: %w", werr)
		}
		perm.add(msgs[idx].owner, callID(msgs[idx].owner), werr)
		pending = dropOwners(msgs, perm)
	default:
		switch classifyFor(msgs[0].kind, werr) {
		case classPermanent:
			for _, m := range msgs {
				rejected(m, werr)
			}
		case classFatal:
			return nil, nil, fmt.Errorf("producer: write: %w", werr)
		default:
			transient, pending = werr, msgs
			for _, m := range msgs {
				retried = append(retried, m.owner)
			}
		}
	}
	if transient != nil && !slices.ContainsFunc(retried, func(o int) bool { return !perm.has(o) }) {
		transient = nil
	}
	return pending, transient, nil
}

// indexOf finds the message kafka-go reported by comparing the identity of
// its key and value slices (kafka-go copies the Message struct, not bytes).
func indexOf(msgs []outMsg, m kafka.Message) int {
	for i := range msgs {
		if sameBytes(msgs[i].msg.Value, m.Value) && sameBytes(msgs[i].msg.Key, m.Key) && msgs[i].msg.Topic == m.Topic {
			return i
		}
	}
	return -1
}

func sameBytes(a, b []byte) bool {
	if len(a) != len(b) {
		return false
	}
	return len(a) == 0 || &a[0] == &b[0]
}

// dropOwners removes the messages whose owner already failed permanently.
func dropOwners(msgs []outMsg, perm *permanent) []outMsg {
	out := msgs[:0:0]
	for _, m := range msgs {
		if !perm.has(m.owner) {
			out = append(out, m)
		}
	}
	return out
}

// permanent collects records that can never be written, with each one's
// error.
type permanent struct {
	errs  map[int]error
	order []int
	ids   []string
	first error
}

func newPermanent() *permanent { return &permanent{errs: map[int]error{}} }

func (p *permanent) add(i int, callID string, err error) {
	if p.has(i) {
		return
	}
	p.errs[i] = err
	p.order = append(p.order, i)
	p.ids = append(p.ids, callID)
	if p.first == nil {
		p.first = err
	}
}

func (p *permanent) has(i int) bool {
	_, ok := p.errs[i]
	return ok
}

func (p *permanent) err() error {
	if len(p.order) == 0 {
		return nil
	}
	return &PermanentError{Indexes: p.order, CallIDs: p.ids, Err: p.first}
}
