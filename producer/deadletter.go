package producer

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/segmentio/kafka-go"

	"github.com/scorer/scorer/schema"
)

// HeaderDLQValueDropped is added to a dead letter whose original value was
// too large to fit in a DLQ record; the value is dropped (its length is the
// header value) so that the failure is still recorded and the input's offset
// can be committed.
const HeaderDLQValueDropped = "scorer.dlq.value_dropped_bytes"

// HeaderDLQDropped marks a minimal dead letter: the full one (original key,
// value, headers and timestamp) could never be written, so it was written
// again without them, stamped now, keeping only the __connect.errors.*
// headers and scorer.dlq.reason. The value names what was dropped and why,
// e.g. "key,value,headers: [10] Message Size Too Large: …". The input's
// offset can then still be committed with its failure on record.
const HeaderDLQDropped = "scorer.dlq.dropped"

// Truncation limits for the minimal dead letter, so that it fits any sane
// max.message.bytes whatever the original error said.
const (
	minimalMaxMessage = 1024 // __connect.errors.exception.message
	minimalMaxField   = 256  // other error headers
	minimalMaxCause   = 512  // the cause in HeaderDLQDropped
	maxIDInError      = 64   // dead letter key shown in a PermanentError
)

// DeadLetter writes each dead letter to DLQTopic with its original key,
// value, timestamp and headers plus the Connect error headers
// (DeadLetter.ErrorHeaders). A value too large for the DLQ record is dropped
// and HeaderDLQValueDropped set, so the failure is still recorded.
//
// A dead letter that still cannot be written (its key or headers alone are
// over the DLQ topic's record limit, or the broker rejects it as too large, invalid or with an
// out-of-range timestamp, even when sent alone) is written once more in
// minimal form: no key, value or original headers, timestamp now, the error
// headers with the message truncated, and HeaderDLQDropped saying what was
// dropped and why. DeadLetter returns nil when every dead letter landed in
// one form or the other, and a *PermanentError whose FailedIndexes name only
// those that failed even in minimal form. Other errors are as for Publish.
func (p *Producer) DeadLetter(ctx context.Context, dls []schema.DeadLetter) error {
	if !p.enter() {
		return ErrClosed
	}
	defer p.mu.RUnlock()

	id := func(i int) string { return truncate(string(dls[i].Key), maxIDInError) }
	perm := newPermanent()
	msgs := make([]outMsg, 0, len(dls))
	for i := range dls {
		m, err := p.fullDeadLetter(&dls[i])
		if err != nil {
			perm.add(i, id(i), err)
			continue
		}
		msgs = append(msgs, outMsg{msg: m, owner: i, kind: kindDLQ})
	}
	if err := p.write(ctx, msgs, perm, id); err != nil {
		return err
	}
	if len(perm.order) == 0 {
		return nil
	}

	// Second and last chance: the minimal form.
	final := newPermanent()
	minimal := make([]outMsg, 0, len(perm.order))
	for _, i := range perm.order {
		d, cause := &dls[i], perm.errs[i]
		m := p.minimalDeadLetter(d, cause)
		p.log.Warn().Err(cause).Str("topic", d.Topic).Int("partition", d.Partition).Int64("offset", d.Offset).
			Str("reason", d.Reason).Msg("dead letter cannot be written as is; writing it without key, value and headers")
		if err := p.checkSize(m); err != nil {
			final.add(i, id(i), err)
			continue
		}
		minimal = append(minimal, outMsg{msg: m, owner: i, kind: kindDLQ})
	}
	if err := p.write(ctx, minimal, final, id); err != nil {
		return err
	}
	if len(final.order) == 0 {
		return nil
	}
	return &PermanentError{Indexes: final.order, CallIDs: final.ids,
		Err: fmt.Errorf("producer: dead letter rejected even without key, value and headers: %w", final.first)}
}

// fullDeadLetter builds the DLQ record for d, dropping its value (and saying
// so in HeaderDLQValueDropped) when the record would exceed the DLQ topic's record limit. It
// fails when the record is too large even without the value.
func (p *Producer) fullDeadLetter(d *schema.DeadLetter) (kafka.Message, error) {
	m := kafka.Message{
		Topic:   p.cfg.DLQTopic,
		Key:     d.Key,
		Value:   d.Value,
		Headers: kafkaHeaders(d.ErrorHeaders()),
		Time:    d.Timestamp,
	}
	if p.checkSize(m) == nil {
		return m, nil
	}
	m.Value = nil
	m.Headers = append(m.Headers, valueDropped(d))
	if err := p.checkSize(m); err != nil {
		return kafka.Message{}, err
	}
	p.log.Warn().Str("topic", d.Topic).Int("partition", d.Partition).Int64("offset", d.Offset).
		Int("value_bytes", len(d.Value)).Msg("dead letter value too large for the DLQ; value dropped")
	return m, nil
}

// valueDropped is the header that records the size of d's value when a
// dead letter is written without it.
func valueDropped(d *schema.DeadLetter) kafka.Header {
	return kafka.Header{Key: HeaderDLQValueDropped, Value: []byte(strconv.Itoa(len(d.Value)))}
}

// minimalDeadLetter builds the smallest DLQ record that still says which
// input failed and why: the input's trace context (bounded, so a trace
// still reaches its dead letter), the error headers (message truncated),
// the value's size when there was one, and HeaderDLQDropped naming what was
// dropped and cause, the error that kept the full record out. Its
// timestamp is now, which the broker accepts whatever its timestamp rules.
func (p *Producer) minimalDeadLetter(d *schema.DeadLetter, cause error) kafka.Message {
	md := *d
	md.Headers = schema.TraceContext(d.Headers)
	md.Message = truncate(d.Message, minimalMaxMessage)
	md.ExceptionClass = truncate(d.ExceptionClass, minimalMaxField)
	md.Stage = truncate(d.Stage, minimalMaxField)
	md.Reason = truncate(d.Reason, minimalMaxField)
	md.Topic = truncate(d.Topic, minimalMaxField)
	hs := kafkaHeaders(md.ErrorHeaders())

	var dropped []string
	if len(d.Key) > 0 {
		dropped = append(dropped, "key")
	}
	if len(d.Value) > 0 {
		dropped = append(dropped, "value")
		hs = append(hs, valueDropped(d))
	}
	if len(d.Headers) > len(md.Headers) {
		dropped = append(dropped, "headers")
	}
	if len(dropped) == 0 {
		dropped = append(dropped, "none")
	}
	why := strings.Join(dropped, ",") + ": " + truncate(cause.Error(), minimalMaxCause)
	hs = append(hs, kafka.Header{Key: HeaderDLQDropped, Value: []byte(why)})
	return kafka.Message{Topic: p.cfg.DLQTopic, Headers: hs, Time: time.Now()}
}

// truncate shortens s to at most n bytes plus "…", cutting at a rune
// boundary.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}
