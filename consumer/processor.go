package consumer

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"
	"github.com/scorer/scorer/internal/retry"
	"github.com/scorer/scorer/schema"
)

// DLQ reasons the consumer itself assigns (decode failures use
// schema.Reason's names).
const (
	ReasonTooLarge       = "too_large"
	ReasonScoreFailed    = "score_failed"
	ReasonOutputTooLarge = "output_too_large"
	ReasonOutputRejected = "output_rejected"
)

// processor turns a batch of records into acknowledged outputs: it decodes
// them, scores them (with retries, one by one to isolate a failing event,
// and the canary that tells bad input from an outage), publishes results
// and tombstones and dead-letters what cannot be scored or written. It
// starts no goroutines and knows nothing of Kafka's groups or fetching:
// its records come with a generation (whose context and revocation bound
// the work) and settle calls back into the consumer's accounting. A
// processor is safe for concurrent use by the pipeline's workers and turns.
type processor struct {
	cfg    Config
	scorer Scorer
	sink   Sink
	log    zerolog.Logger
	m      *metrics
	// settle takes a record out of the in-flight accounting; with ack it
	// also makes its offset committable.
	settle func(r *record, ack bool)
	// canary is a small event that scored successfully, the probe that
	// tells a poisonous event (the canary still scores) from a scorer
	// outage (it fails too). Nil until something scored.
	canary atomic.Pointer[schema.TranscriptEvent]

	published, deadLettered atomic.Uint64
}

// prepared is one generation's part of a batch, decoded and scored, ready
// to be acknowledged.
type prepared struct {
	g    *genState
	dead []deadRecord
	// out holds the results and deletes to write, in input-offset order.
	out []outItem
}

// outItem is one record's output: its result, or (res nil) a tombstone for
// the deleted call.
type outItem struct {
	r   *record
	res *schema.ScoredTranscript
	del schema.Delete
}

// prepare decodes and scores a batch. Its records normally belong to one
// generation; those of a revoked generation are dropped (the partition's
// new owner reads them again), and each generation's records are processed
// under that generation's context, which ends when it is revoked.
func (pr *processor) prepare(batch []*record) preparedBatch {
	var out preparedBatch
	for len(batch) > 0 {
		g := batch[0].gen
		var mine, rest []*record
		for _, r := range batch {
			if r.gen == g {
				mine = append(mine, r)
			} else {
				rest = append(rest, r)
			}
		}
		if !g.revoked.Load() {
			if p, ok := pr.prepareGen(g, mine); ok {
				out = append(out, p)
			}
		}
		batch = rest
	}
	return out
}

// preparedBatch is a batch decoded and scored, one prepared per generation.
type preparedBatch []prepared

// of returns t's part of the batch: its records' dead letters and outputs.
func (pb preparedBatch) of(t *turn) prepared {
	p := prepared{g: t.g}
	for _, gp := range pb {
		if gp.g != t.g {
			continue
		}
		for _, d := range gp.dead {
			if d.r.ps == t.ps {
				p.dead = append(p.dead, d)
			}
		}
		for _, it := range gp.out {
			if it.r.ps == t.ps {
				p.out = append(p.out, it)
			}
		}
	}
	return p
}

// acknowledge writes the prepared dead letters and results. A record is
// acknowledged (settled with ack) only once its result or dead letter was
// acknowledged by the sink; if the generation's context ends first it stays
// unacknowledged and is redelivered.
func (pr *processor) acknowledge(p prepared) {
	if p.g.revoked.Load() {
		return
	}
	if !pr.deadLetter(p.g.ctx, p.g, p.dead) {
		return
	}
	// Runs of results and of deletes, in offset order, so that a
	// delete and a version of the same call keep their input order.
	for rest := p.out; len(rest) > 0 && !p.g.revoked.Load(); {
		n := 1
		for n < len(rest) && (rest[n].res == nil) == (rest[0].res == nil) {
			n++
		}
		run := rest[:n]
		rest = rest[n:]
		if _, ok := pr.sink.(Deleter); run[0].res == nil && !ok {
			dead := make([]deadRecord, len(run))
			for i, it := range run {
				dead[i] = deadRecord{it.r, schema.StageProduce, ReasonDeleteUnsupported, "consumer.DeleteUnsupported",
					"the sink cannot write tombstones"}
			}
			pr.deadLetter(p.g.ctx, p.g, dead)
			continue
		}
		pr.write(p.g.ctx, p.g, run)
	}
}

// Deleter is the optional part of a Sink that forwards deletes: Delete
// writes a tombstone (a null value) for each deleted call on the output
// topic and returns once the broker acknowledged them (errors as for
// Publish).
// producer satisfies it. With a Sink that lacks it, deletes are
// dead-lettered (reason delete_unsupported).
type Deleter interface {
	Delete(ctx context.Context, dels []schema.Delete) error
}

// ReasonDeleteUnsupported is the DLQ reason of a delete (tombstone or
// Debezium op d) when the Sink cannot forward deletes.
const ReasonDeleteUnsupported = "delete_unsupported"

// prepareGen decodes and scores one generation's records: the ones to
// dead-letter and the results to publish. ok is false if the generation's
// context ended before scoring finished (nothing is acknowledged then).
func (pr *processor) prepareGen(g *genState, batch []*record) (p prepared, ok bool) {
	ctx := g.ctx
	p.g = g
	var (
		dead    []deadRecord
		events  []schema.TranscriptEvent
		scored  []*record
		deletes = map[*record]schema.Delete{}
	)
	for _, r := range batch {
		if len(r.msg.Value) > pr.cfg.MaxMessageBytes {
			dead = append(dead, deadRecord{r, schema.StageDecode, ReasonTooLarge, "consumer.MessageTooLarge",
				fmt.Sprintf("record value is %d bytes, limit %d", len(r.msg.Value), pr.cfg.MaxMessageBytes)})
			continue
		}
		ev, del, err := pr.decodeGuarded(r.msg.Key, r.msg.Value)
		if err == nil && del != nil {
			deletes[r] = *del
			continue
		}
		if err != nil {
			reason, class := "decode_failed", exceptionClass(err)
			var de *schema.DecodeError
			if errors.As(err, &de) {
				reason, class = de.Reason.String(), "schema.DecodeError"
			}
			pr.log.Debug().Int("partition", r.msg.Partition).Int64("offset", r.msg.Offset).Str("reason", reason).Msg("undecodable record")
			dead = append(dead, deadRecord{r, schema.StageDecode, reason, class, err.Error()})
			continue
		}
		events = append(events, ev)
		scored = append(scored, r)
	}
	res := map[*record]*schema.ScoredTranscript{}
	if len(events) > 0 {
		results, failed, ok := pr.scoreStage(ctx, events)
		if !ok {
			return p, false
		}
		for i, r := range scored {
			if err := failed[i]; err != nil {
				dead = append(dead, deadRecord{r, schema.StageScore, ReasonScoreFailed, exceptionClass(err), err.Error()})
				continue
			}
			st := results[i]
			st.Source = &schema.Source{Topic: r.msg.Topic, Partition: r.msg.Partition, Offset: r.msg.Offset, Generation: g.id,
				Trace: traceContext(r.msg.Headers)}
			res[r] = &st
		}
	}
	for _, r := range batch {
		if st, ok := res[r]; ok {
			p.out = append(p.out, outItem{r: r, res: st})
		} else if d, ok := deletes[r]; ok {
			p.out = append(p.out, outItem{r: r, del: d})
		}
	}
	p.dead = dead
	return p, true
}

// write writes a run of results or of tombstones (never both: see
// acknowledge), retrying transient failures until ctx ends (never dropping:
// an unacknowledged record is redelivered after restart). Records the sink
// rejects permanently are dead-lettered. It checks the generation right
// before every write: once revoked, the partition belongs to another
// member, which writes these records itself.
func (pr *processor) write(ctx context.Context, g *genState, run []outItem) {
	backoff := retry.New(pr.cfg.RetryBackoff, pr.cfg.RetryBackoffMax)
	for !g.revoked.Load() {
		err := pr.send(ctx, run)
		if err == nil {
			for _, it := range run {
				pr.written(it)
			}
			return
		}
		if ctx.Err() != nil {
			return
		}
		if IsPermanent(err) {
			pr.writePermanent(ctx, g, run, err)
			return
		}
		what := "publish"
		if run[0].res == nil {
			what = "tombstone write"
		}
		pr.log.Warn().Err(fmt.Errorf("consumer: %s: %w", what, err)).Int("records", len(run)).Msg(what + " failed; retrying")
		if !backoff.Wait(ctx) {
			return
		}
	}
}

// send hands a run to the sink: Publish for results, Delete for tombstones.
func (pr *processor) send(ctx context.Context, run []outItem) error {
	if run[0].res == nil {
		dels := make([]schema.Delete, len(run))
		for i, it := range run {
			dels[i] = it.del
		}
		return pr.sink.(Deleter).Delete(ctx, dels)
	}
	results := make([]schema.ScoredTranscript, len(run))
	for i, it := range run {
		results[i] = *it.res
	}
	return pr.sink.Publish(ctx, results)
}

// written acknowledges a record whose result or tombstone the sink
// acknowledged.
func (pr *processor) written(it outItem) {
	if it.res == nil {
		pr.m.tombstones.Inc()
	} else {
		pr.m.endToEnd.Observe(time.Since(it.r.msg.Time).Seconds())
	}
	pr.published.Add(1)
	pr.settle(it.r, true)
}

// writePermanent handles a permanent Publish or Delete error: the named
// records (or, when the error names none, each record found by writing one
// at a time) go to the DLQ; the sink acknowledged the others.
func (pr *processor) writePermanent(ctx context.Context, g *genState, run []outItem, err error) {
	reason := ReasonOutputRejected
	if isTooLarge(err) {
		reason = ReasonOutputTooLarge
	}
	idx := failedIndexes(err)
	if len(run) == 1 {
		idx = []int{0}
	}
	if len(idx) == 0 {
		for i := range run {
			pr.write(ctx, g, run[i:i+1])
		}
		return
	}
	bad := map[int]bool{}
	for _, i := range idx {
		if i >= 0 && i < len(run) {
			bad[i] = true
		}
	}
	var dead []deadRecord
	for i, it := range run {
		if bad[i] {
			dead = append(dead, deadRecord{it.r, schema.StageProduce, reason, exceptionClass(err), err.Error()})
			continue
		}
		pr.written(it)
	}
	pr.deadLetter(ctx, g, dead)
}

// errPanic marks a failure that was a recovered panic: a bug met by one
// input. Recovering turns a crash loop on that record (it would never be
// committed) into a dead letter; the stack goes to the log at error level.
var errPanic = errors.New("panic")

// decodeGuarded is schema.DecodeRecord with a panic turned into an error,
// so one record that trips a decoder bug is dead-lettered, not a crash loop.
func (pr *processor) decodeGuarded(key, value []byte) (ev schema.TranscriptEvent, del *schema.Delete, err error) {
	defer func() {
		if p := recover(); p != nil {
			pr.log.Error().Str("stack", string(debug.Stack())).Msgf("decoder panicked: %v", p)
			err = fmt.Errorf("consumer: decoding: %w: %v", errPanic, p)
		}
	}()
	return schema.DecodeRecord(key, value, pr.cfg.Limits)
}
