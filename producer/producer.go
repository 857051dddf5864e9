package producer

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/segmentio/kafka-go"

	"github.com/scorer/scorer/internal/retry"
	"github.com/scorer/scorer/schema"
)

// Metric kinds for scorer_messages_out_total.
const (
	kindResult = "result"
	kindRow    = "row"
	kindDLQ    = "dlq"
	kindTomb   = "tombstone"
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

// Retry backoff bounds for the Producer's own retry loop (write).
const (
	retryBackoffMin = 50 * time.Millisecond
	retryBackoffMax = 2 * time.Second
)

// Producer writes scorer's output records with one produce request per
// partition chunk (see requestWriter: nothing is queued or retried in the
// background, so nothing of a call is written after its ctx ended beyond
// the requests already on the wire). It is safe for concurrent use. Create
// it with New and release it with Close.
type Producer struct {
	cfg       Config
	w         *requestWriter
	transport kafka.RoundTripper
	log       zerolog.Logger
	metrics   *metrics

	mu     sync.RWMutex
	closed bool
}

// New validates cfg (applying defaults), builds the writer and registers the
// producer's metrics on reg (nil = no metrics). It does not connect: the
// first write does.
func New(cfg Config, log zerolog.Logger, reg prometheus.Registerer) (*Producer, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	comp, _ := compression(cfg.Compression) // checked by Validate
	m, err := newMetrics(reg)
	if err != nil {
		return nil, err
	}
	var transport kafka.RoundTripper = cfg.Transport
	if cfg.Transport == nil {
		transport = &kafka.Transport{ClientID: cfg.ClientID}
	}
	return &Producer{
		cfg:       cfg,
		w:         newWriter(cfg, comp, transport, cfg.BatchSize),
		transport: transport,
		log:       log,
		metrics:   m,
	}, nil
}

// newWriter builds an acks=all request writer with at most batchSize
// records per request.
func newWriter(cfg Config, comp kafka.Compression, transport kafka.RoundTripper, batchSize int) *requestWriter {
	return &requestWriter{
		client: &kafka.Client{Addr: kafka.TCP(cfg.Brokers...), Timeout: cfg.WriteTimeout, Transport: transport},
		// murmur2 on the key, as Java producers, Kafka Streams and
		// librdkafka's consistent_random do: every record of one key lands
		// on one partition, the one a Java client would pick, so
		// co-partitioned joins on call_id work. (Until this release the
		// partitioner was kafka-go's FNV-1a Hash; see README, Output.)
		balancer:    kafka.Murmur2Balancer{},
		compression: comp,
		batchSize:   batchSize,
		batchBytes:  cfg.BatchBytes,
		recordLimit: cfg.recordLimit,
		autoCreate:  cfg.AllowAutoTopicCreation,
	}
}

// WriterConfig returns the acknowledgement level and the partitioner the
// producer runs with, so callers and tests can check them without a broker.
func (p *Producer) WriterConfig() (acks kafka.RequiredAcks, balancer kafka.Balancer) {
	return kafka.RequireAll, p.w.balancer
}

// outMsg is a message plus what it belongs to: owner is its index in the
// caller's slice, kind its metric label. alone is set once a batch-level
// rejection covered it: a broker rejects a whole partition batch for one
// bad record (MESSAGE_TOO_LARGE when the batch exceeds max.message.bytes,
// INVALID_RECORD, …), so from then on it is sent in a request of its own,
// and its errors are its own, before it is declared permanent.
type outMsg struct {
	msg   kafka.Message
	owner int
	kind  string
	alone bool
}

// Publish writes each ScoredTranscript to Topic (key = call_id, value = JSON
// or Connect envelope, headers scorer.model.sha256 and scorer.content.sha256
// = SHA-256 of the value bytes sent) and, when RowsTopic is set, its rows
// first. Ordering: a transcript's rows are written and acknowledged before
// any transcript of the call is written, so a reader of Topic can rely on the
// rows being there; both are acknowledged before Publish returns nil.
//
// Transient failures (leader changes, timeouts, broken connections) are
// retried with backoff until ctx ends. Records that can never be written
// (larger than their topic accepts, see Config.TopicMaxBytes, not JSON-encodable, or rejected by the broker as
// too large or invalid even when sent alone) are skipped, together with their
// rows, and reported in a *PermanentError after every other record was
// acknowledged. A broker rejection of a whole batch is first retried record
// by record, so only the records that fail alone are reported. Other errors
// (authorization, ctx) are returned as is and nothing about which records
// landed is promised: the caller retries the whole call, and duplicates are
// absorbed by the deterministic keys.
func (p *Producer) Publish(ctx context.Context, sts []schema.ScoredTranscript) error {
	if !p.enter() {
		return ErrClosed
	}
	defer p.mu.RUnlock()

	perm := newPermanent()
	callID := func(i int) string { return sts[i].CallID }
	var rows, results []outMsg
	for i := range sts {
		st := &sts[i]
		res, err := p.resultMessage(st)
		if err != nil {
			perm.add(i, st.CallID, err)
			continue
		}
		if err := p.checkSize(res); err != nil {
			perm.add(i, st.CallID, err)
			continue
		}
		if p.cfg.RowsTopic != "" {
			// Rows are encoded and written in chunks of BatchSize as they
			// are built, so a batch of short sentences (an 8 MiB batch
			// can be ~240k rows) never holds all its encoded rows at once.
			for _, r := range schema.Rows(st) {
				m, err := p.rowMessage(&r, st.Model.SHA256, st.Source)
				if err == nil {
					err = p.checkSize(m)
				}
				if err != nil {
					perm.add(i, st.CallID, err)
					break
				}
				rows = append(rows, outMsg{msg: m, owner: i, kind: kindRow})
				if len(rows) >= p.cfg.BatchSize {
					if err := p.write(ctx, dropOwners(rows, perm), perm, callID); err != nil {
						return err
					}
					rows = rows[:0]
				}
			}
			if perm.has(i) {
				continue
			}
		}
		results = append(results, outMsg{msg: res, owner: i, kind: kindResult})
	}

	if p.cfg.RowsTopic != "" {
		if err := p.write(ctx, dropOwners(rows, perm), perm, callID); err != nil {
			return err
		}
		// A transcript whose rows were rejected is not published either:
		// results and rows stay consistent.
		results = dropOwners(results, perm)
	}
	if err := p.write(ctx, results, perm, callID); err != nil {
		return err
	}
	return perm.err()
}

// Delete writes a tombstone (the key with a null value) for each deleted
// call on Topic (keyed as its result would be, see Config.Key), so that a compacted output topic and a JDBC sink with
// delete.enabled=true drop the call's scored record. The rows topic is left
// alone: its keys are per sentence, and which rows a call had is not known
// here (see README, Tombstones). Errors are as for Publish.
func (p *Producer) Delete(ctx context.Context, dels []schema.Delete) error {
	if !p.enter() {
		return ErrClosed
	}
	defer p.mu.RUnlock()
	perm := newPermanent()
	msgs := make([]outMsg, 0, len(dels))
	for i, d := range dels {
		// Under KeyEntityEvent a plain tombstone (it names only the call)
		// has no key: it is reported, not guessed.
		key, err := p.resultKey(d.CallID, d.EntityID, d.EventTime)
		if err != nil {
			perm.add(i, d.CallID, err)
			continue
		}
		msgs = append(msgs, outMsg{msg: kafka.Message{Topic: p.cfg.Topic, Key: key}, owner: i, kind: kindTomb})
	}
	if err := p.write(ctx, msgs, perm, func(i int) string { return dels[i].CallID }); err != nil {
		return err
	}
	return perm.err()
}

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

// enter takes the read lock unless the producer is closed; Close takes the
// write lock, so it waits for in-flight calls only as long as its ctx allows.
func (p *Producer) enter() bool {
	p.mu.RLock()
	if p.closed {
		p.mu.RUnlock()
		return false
	}
	return true
}

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

// resultMessage encodes one ScoredTranscript for Topic.
func (p *Producer) resultMessage(st *schema.ScoredTranscript) (kafka.Message, error) {
	var value []byte
	var err error
	if p.cfg.Format == FormatConnect {
		value, err = schema.EnvelopeScoredTranscript(st)
	} else {
		value, err = schema.MarshalValue(st)
	}
	if err != nil {
		return kafka.Message{}, fmt.Errorf("producer: encode transcript %q: %w", st.CallID, err)
	}
	key, err := p.resultKey(st.CallID, st.EntityID, st.EventTime)
	if err != nil {
		return kafka.Message{}, err
	}
	return kafka.Message{
		Topic:   p.cfg.Topic,
		Key:     key,
		Value:   value,
		Headers: outputHeaders(st.Model.SHA256, value, st.Source),
	}, nil
}

// resultKey is the key of a call's result (and tombstone): call_id, or
// under KeyEntityEvent the EventKey as JSON (a JsonConverter envelope with
// FormatConnect, the struct key a JDBC sink's pk.mode=record_key reads).
func (p *Producer) resultKey(callID, entityID, eventTime string) ([]byte, error) {
	if p.cfg.Key != KeyEntityEvent {
		return []byte(callID), nil
	}
	k, err := schema.NewEventKey(callID, entityID, eventTime)
	if err != nil {
		return nil, fmt.Errorf("producer: %w", err)
	}
	var key []byte
	if p.cfg.Format == FormatConnect {
		key, err = schema.EnvelopeEventKey(k)
	} else {
		key, err = json.Marshal(k)
	}
	if err != nil {
		return nil, fmt.Errorf("producer: encode key of %q: %w", callID, err)
	}
	return key, nil
}

// rowMessage encodes one ScoreRow for RowsTopic, keyed by its RowKey so a
// JDBC sink can upsert (pk.mode=record_key).
func (p *Producer) rowMessage(r *schema.ScoreRow, modelSHA string, src *schema.Source) (kafka.Message, error) {
	var key, value []byte
	var err error
	switch {
	case p.cfg.Key == KeyEntityEvent:
		var k schema.EventRowKey
		if k, err = r.EventRowKey(); err != nil {
			return kafka.Message{}, fmt.Errorf("producer: %w", err)
		}
		if p.cfg.Format == FormatConnect {
			key, err = schema.EnvelopeEventRowKey(k)
		} else {
			key, err = json.Marshal(k)
		}
	case p.cfg.Format == FormatConnect:
		key, err = schema.EnvelopeRowKey(r.Key())
	default:
		key, err = json.Marshal(r.Key())
	}
	if err == nil {
		if p.cfg.Format == FormatConnect {
			value, err = schema.EnvelopeScoreRow(r)
		} else {
			value, err = schema.MarshalValue(r)
		}
	}
	if err != nil {
		return kafka.Message{}, fmt.Errorf("producer: encode row %s/%s/%d/%s: %w", r.CallID, r.Section, r.SentenceIndex, r.Label, err)
	}
	return kafka.Message{Topic: p.cfg.RowsTopic, Key: key, Value: value, Headers: outputHeaders(modelSHA, value, src)}, nil
}

// outputHeaders returns the model hash, the SHA-256 of value, the exact
// bytes written (not the input record: the producer never sees it, and a hash
// of the output lets a reader verify what it got), and, when src is known,
// the input record and generation it came from, so that a sink can drop
// stale writes without parsing the value (rows carry no source field), and
// last the input record's trace context, so a trace crosses the scorer.
func outputHeaders(modelSHA string, value []byte, src *schema.Source) []kafka.Header {
	sum := sha256.Sum256(value)
	hs := []kafka.Header{
		{Key: schema.HeaderModelSHA256, Value: []byte(modelSHA)},
		{Key: schema.HeaderContentSHA256, Value: []byte(hex.EncodeToString(sum[:]))},
	}
	if src != nil {
		hs = append(hs,
			kafka.Header{Key: schema.HeaderSourceTopic, Value: []byte(src.Topic)},
			kafka.Header{Key: schema.HeaderSourcePartition, Value: []byte(strconv.Itoa(src.Partition))},
			kafka.Header{Key: schema.HeaderSourceOffset, Value: []byte(strconv.FormatInt(src.Offset, 10))},
			kafka.Header{Key: schema.HeaderSourceGeneration, Value: []byte(strconv.Itoa(int(src.Generation)))})
		hs = append(hs, kafkaHeaders(src.Trace)...)
	}
	return hs
}

func kafkaHeaders(hs []schema.Header) []kafka.Header {
	out := make([]kafka.Header, len(hs))
	for i, h := range hs {
		out[i] = kafka.Header{Key: h.Key, Value: h.Value}
	}
	return out
}

// recordSize is an upper bound of the size kafka-go checks against
// BatchBytes (its Message.totalSize): fixed fields plus key, value and
// headers, with generous varint overheads.
func recordSize(m kafka.Message) int64 {
	n := int64(4+1+1+8) + 4 + int64(len(m.Key)) + 4 + int64(len(m.Value)) + 5
	for _, h := range m.Headers {
		n += 10 + int64(len(h.Key)) + int64(len(h.Value))
	}
	return n
}

// checkSize rejects a record larger than its topic accepts (see
// Config.TopicMaxBytes) before it is sent, so the caller gets a
// *PermanentError naming it rather than a whole failed call.
func (p *Producer) checkSize(m kafka.Message) error {
	if n, limit := recordSize(m), p.cfg.recordLimit(m.Topic); n > limit {
		return fmt.Errorf("producer: record for %s is about %d bytes, limit %d: %w", m.Topic, n, limit, kafka.MessageSizeTooLarge)
	}
	return nil
}

// Close waits, bounded by ctx, for Publish and DeadLetter calls in progress
// (there is no queue to flush: nothing is written in the background) and
// closes idle connections. On timeout it logs and returns ctx's error.
// Publish and DeadLetter return ErrClosed afterwards.
func (p *Producer) Close(ctx context.Context) error {
	done := make(chan error, 1)
	go func() {
		p.mu.Lock()
		p.closed = true
		p.mu.Unlock()
		if t, ok := p.transport.(*kafka.Transport); ok {
			t.CloseIdleConnections()
		}
		done <- nil
	}()
	select {
	case err := <-done:
		if err != nil {
			return fmt.Errorf("producer: close: %w", err)
		}
		return nil
	case <-ctx.Done():
		p.log.Error().Err(ctx.Err()).Msg("producer close did not finish before the shutdown deadline")
		return fmt.Errorf("producer: close: %w", ctx.Err())
	}
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
