package consumer

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

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

// batchLoop owns the Batcher: it takes a batch slot before it starts a
// batch (so a batch is only built when a worker will be able to take it),
// fills it from the fetchers and hands it to the workers when a rule fires.
func (c *Consumer) batchLoop(ctx context.Context) {
	b := NewBatcher(BatchPolicy{
		MaxMessages: c.cfg.BatchMaxMessages,
		MaxBytes:    c.cfg.BatchMaxBytes,
		MaxWait:     c.cfg.BatchMaxWait,
	}, func(r *record) int { return len(r.msg.Value) })
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	haveSlot := false
	var held *record // a record that overflowed the previous batch
	dispatch := func() {
		batch, why := b.Flush()
		if batch == nil {
			return
		}
		haveSlot = false
		c.batches[why].Add(1)
		c.m.batchSize.Observe(float64(len(batch)))
		c.work <- batch // never blocks: at most cap(slots) batches exist
	}
	defer func() {
		// Abandoned on shutdown: never acknowledged, so never committed.
		batch, _ := b.Flush()
		if held != nil {
			batch = append(batch, held)
		}
		for _, r := range batch {
			c.settle(r, false)
		}
	}()
	for {
		if !haveSlot {
			select {
			case c.slots <- struct{}{}:
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
		case r := <-c.in:
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

// worker processes batches one at a time and frees the batch's slot when
// every record in it is acknowledged or abandoned.
func (c *Consumer) worker(ctx context.Context) {
	for {
		select {
		case batch := <-c.work:
			c.process(ctx, batch)
			for _, r := range batch {
				c.settle(r, false) // no-op for acknowledged records
			}
			<-c.slots
		case <-ctx.Done():
			return
		}
	}
}

// process decodes, scores and publishes one batch. A record is acknowledged
// (settled with ack) only once its result or dead letter was acknowledged
// by the sink; if ctx ends first it stays unacknowledged and is redelivered.
func (c *Consumer) process(ctx context.Context, batch []*record) {
	var (
		dead   []deadRecord
		events []schema.TranscriptEvent
		scored []*record
	)
	for _, r := range batch {
		if r.gen.revoked.Load() {
			continue // the partition's new owner reads it again
		}
		if len(r.msg.Value) > c.cfg.MaxMessageBytes {
			dead = append(dead, deadRecord{r, schema.StageDecode, ReasonTooLarge, "consumer.MessageTooLarge",
				fmt.Sprintf("record value is %d bytes, limit %d", len(r.msg.Value), c.cfg.MaxMessageBytes)})
			continue
		}
		ev, err := schema.DecodeEvent(r.msg.Value, c.cfg.Limits)
		if err != nil {
			reason, class := "decode_failed", exceptionClass(err)
			var de *schema.DecodeError
			if errors.As(err, &de) {
				reason, class = de.Reason.String(), "schema.DecodeError"
			}
			c.log.Debug().Int("partition", r.msg.Partition).Int64("offset", r.msg.Offset).Str("reason", reason).Msg("undecodable record")
			dead = append(dead, deadRecord{r, schema.StageDecode, reason, class, err.Error()})
			continue
		}
		events = append(events, ev)
		scored = append(scored, r)
	}
	// Dead letters first: they are cheap and must not wait on scoring.
	if !c.deadLetter(ctx, dead) {
		return
	}
	if len(events) == 0 {
		return
	}
	results, failed := c.score(ctx, events)
	if ctx.Err() != nil {
		return
	}
	var okRecs []*record
	var okResults []schema.ScoredTranscript
	dead = dead[:0]
	for i, r := range scored {
		if err := failed[i]; err != nil {
			dead = append(dead, deadRecord{r, schema.StageScore, ReasonScoreFailed, exceptionClass(err), err.Error()})
			continue
		}
		res := results[i]
		res.Source = &schema.Source{Topic: r.msg.Topic, Partition: r.msg.Partition, Offset: r.msg.Offset}
		okRecs = append(okRecs, r)
		okResults = append(okResults, res)
	}
	if !c.deadLetter(ctx, dead) {
		return
	}
	c.publish(ctx, okRecs, okResults)
}

type deadRecord struct {
	r                    *record
	stage, reason, class string
	message              string
}

// exceptionClass names err's type the way Connect's exception class header
// names a Java class: the Go type, without the pointer star.
func exceptionClass(err error) string {
	return strings.TrimPrefix(fmt.Sprintf("%T", err), "*")
}

// deadLetter writes the dead letters, retrying until the sink acknowledges
// or ctx ends, then acknowledges their records. It reports false if ctx
// ended first.
func (c *Consumer) deadLetter(ctx context.Context, dead []deadRecord) bool {
	if len(dead) == 0 {
		return true
	}
	dls := make([]schema.DeadLetter, len(dead))
	for i, d := range dead {
		m := d.r.msg
		hs := make([]schema.Header, len(m.Headers))
		for j, h := range m.Headers {
			hs[j] = schema.Header{Key: h.Key, Value: h.Value}
		}
		dls[i] = schema.DeadLetter{
			Key: m.Key, Value: m.Value, Headers: hs, Timestamp: m.Time,
			Topic: m.Topic, Partition: m.Partition, Offset: m.Offset,
			Stage: d.stage, Reason: d.reason, ExceptionClass: d.class, Message: d.message,
		}
	}
	backoff := c.cfg.RetryBackoff
	for {
		err := c.sink.DeadLetter(ctx, dls)
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return false
		}
		// A DLQ write that can never succeed would block the partition
		// forever; still retry, loudly: dropping input silently is worse.
		c.log.Error().Err(fmt.Errorf("consumer: dead letter: %w", err)).Int("records", len(dls)).Msg("DLQ write failed; retrying")
		if !sleepCtx(ctx, backoff) {
			return false
		}
		backoff = min(backoff*2, c.cfg.RetryBackoffMax)
	}
	for _, d := range dead {
		c.m.dlq.WithLabelValues(d.reason).Inc()
		c.deadLettered.Add(1)
		c.log.Info().Int("partition", d.r.msg.Partition).Int64("offset", d.r.msg.Offset).
			Str("stage", d.stage).Str("reason", d.reason).Msg("record dead-lettered")
		c.settle(d.r, true)
	}
	return true
}

// score scores the events as one batch with ScoreAttempts tries; if that
// keeps failing it scores them one by one, so one poisonous event does not
// sink its neighbours. failed[i] is set for events that could not be scored.
func (c *Consumer) score(ctx context.Context, events []schema.TranscriptEvent) ([]schema.ScoredTranscript, map[int]error) {
	results, err := c.scoreWithRetry(ctx, events)
	if err == nil {
		return results, nil
	}
	if len(events) == 1 {
		return make([]schema.ScoredTranscript, 1), map[int]error{0: err}
	}
	c.log.Warn().Err(err).Int("events", len(events)).Msg("batch scoring failed; scoring events one by one")
	results = make([]schema.ScoredTranscript, len(events))
	failed := map[int]error{}
	for i := range events {
		if ctx.Err() != nil {
			return nil, nil
		}
		one, err := c.scoreWithRetry(ctx, events[i:i+1])
		if err != nil {
			failed[i] = err
			continue
		}
		results[i] = one[0]
	}
	return results, failed
}

func (c *Consumer) scoreWithRetry(ctx context.Context, events []schema.TranscriptEvent) ([]schema.ScoredTranscript, error) {
	backoff := c.cfg.RetryBackoff
	var err error
	for attempt := range c.cfg.ScoreAttempts {
		if attempt > 0 && !sleepCtx(ctx, backoff) {
			return nil, ctx.Err()
		}
		backoff = min(backoff*2, c.cfg.RetryBackoffMax)
		var res []schema.ScoredTranscript
		res, err = c.scorer.Score(ctx, events)
		if err == nil && len(res) != len(events) {
			err = fmt.Errorf("scorer returned %d results for %d events", len(res), len(events))
		}
		if err == nil {
			return res, nil
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
	}
	return nil, fmt.Errorf("consumer: score %d events: %w", len(events), err)
}

// publish writes the results, retrying transient failures until ctx ends
// (never dropping: an unacknowledged record is redelivered after restart).
// Records the sink rejects permanently are dead-lettered.
func (c *Consumer) publish(ctx context.Context, recs []*record, results []schema.ScoredTranscript) {
	backoff := c.cfg.RetryBackoff
	for len(recs) > 0 {
		err := c.sink.Publish(ctx, results)
		if err == nil {
			now := time.Now()
			for _, r := range recs {
				c.m.endToEnd.Observe(now.Sub(r.msg.Time).Seconds())
				c.published.Add(1)
				c.settle(r, true)
			}
			return
		}
		if ctx.Err() != nil {
			return
		}
		if IsPermanent(err) {
			c.publishPermanent(ctx, recs, results, err)
			return
		}
		c.log.Warn().Err(fmt.Errorf("consumer: publish: %w", err)).Int("records", len(recs)).Msg("publish failed; retrying")
		if !sleepCtx(ctx, backoff) {
			return
		}
		backoff = min(backoff*2, c.cfg.RetryBackoffMax)
		// Records of a revoked generation are the new owner's to redo.
		keepRecs, keepRes := recs[:0:0], results[:0:0]
		for i, r := range recs {
			if !r.gen.revoked.Load() {
				keepRecs, keepRes = append(keepRecs, r), append(keepRes, results[i])
			}
		}
		recs, results = keepRecs, keepRes
	}
}

// publishPermanent handles a permanent Publish error: the named records (or,
// when the error names none, each record found by publishing one at a time)
// go to the DLQ; the others are acknowledged or published again.
func (c *Consumer) publishPermanent(ctx context.Context, recs []*record, results []schema.ScoredTranscript, err error) {
	reason := ReasonOutputRejected
	if IsPermanent(err) && isTooLarge(err) {
		reason = ReasonOutputTooLarge
	}
	idx := failedIndexes(err)
	if len(recs) == 1 {
		idx = []int{0}
	}
	if len(idx) == 0 {
		for i := range recs {
			c.publish(ctx, recs[i:i+1], results[i:i+1])
		}
		return
	}
	bad := map[int]bool{}
	for _, i := range idx {
		if i >= 0 && i < len(recs) {
			bad[i] = true
		}
	}
	var dead []deadRecord
	for i, r := range recs {
		if bad[i] {
			dead = append(dead, deadRecord{r, schema.StageProduce, reason, exceptionClass(err), err.Error()})
			continue
		}
		// The sink acknowledged every record it did not name.
		c.m.endToEnd.Observe(time.Since(r.msg.Time).Seconds())
		c.published.Add(1)
		c.settle(r, true)
	}
	c.deadLetter(ctx, dead)
}
