package producer

import (
	"context"
	"fmt"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/segmentio/kafka-go"

	"github.com/scorer/scorer/schema"
)

// Metric kinds for scorer_messages_out_total.
const (
	kindResult = "result"
	kindRow    = "row"
	kindDLQ    = "dlq"
	kindTomb   = "tombstone"
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
