package consumer

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/scorer/scorer/internal/retry"
	"github.com/scorer/scorer/schema"
)

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

// dlqLogInterval is the least time between two error lines about the same
// failing dead-letter write: loud, without flooding the log.
const dlqLogInterval = 5 * time.Second

// deadLetter writes the dead letters and acknowledges each record once the
// sink acknowledged its dead letter. Failures are retried with backoff
// until ctx ends or the generation is revoked, never dropped (dropping
// input silently is worse than holding the partition's commits back): a
// transient failure resends what is left; a permanent one resends only the
// records it names (FailedIndexes), because the sink acknowledged the
// others and resending them would duplicate them in the DLQ; a permanent
// one that names none resends each record on its own to find the failing
// ones. Every failure counts in scorer_dlq_write_errors_total and is logged
// at error level, at most once per dlqLogInterval. It reports false if it
// stopped before every dead letter was acknowledged.
func (pr *processor) deadLetter(ctx context.Context, g *genState, dead []deadRecord) bool {
	backoff := retry.New(pr.cfg.RetryBackoff, pr.cfg.RetryBackoffMax)
	var lastLog time.Time
	failures := 0
	for len(dead) > 0 {
		if g.revoked.Load() {
			return false // the partition's new owner redoes them
		}
		err := pr.sink.DeadLetter(ctx, deadLetters(dead))
		if err == nil {
			for _, d := range dead {
				pr.ackDead(d)
			}
			return true
		}
		if ctx.Err() != nil {
			return false
		}
		kind := "transient"
		if IsPermanent(err) {
			kind = "permanent"
			failed := map[int]bool{}
			for _, i := range failedIndexes(err) {
				if i >= 0 && i < len(dead) {
					failed[i] = true
				}
			}
			if len(failed) == 0 && len(dead) > 1 {
				// The sink did not say which were written: find out one by
				// one (at worst a dead letter is written twice, never lost).
				pr.m.dlqErrors.WithLabelValues(kind).Inc()
				pr.log.Error().Err(fmt.Errorf("consumer: dead letter: %w", err)).Int("records", len(dead)).
					Msg("DLQ write failed permanently without naming the records; writing them one by one")
				for i := range dead {
					if !pr.deadLetter(ctx, g, dead[i:i+1]) {
						return false
					}
				}
				return true
			}
			if len(failed) > 0 {
				var retry []deadRecord
				for i, d := range dead {
					if failed[i] {
						retry = append(retry, d)
					} else {
						pr.ackDead(d)
					}
				}
				dead = retry
			}
		}
		failures++
		pr.m.dlqErrors.WithLabelValues(kind).Inc()
		if now := time.Now(); now.Sub(lastLog) >= dlqLogInterval {
			lastLog = now
			offsets := make([]int64, len(dead))
			for i, d := range dead {
				offsets[i] = d.r.msg.Offset
			}
			pr.log.Error().Err(fmt.Errorf("consumer: dead letter: %w", err)).Str("kind", kind).
				Int("partition", dead[0].r.msg.Partition).Ints64("offsets", offsets).Int("failures", failures).
				Dur("retry_in", backoff.Pause()).Msg("DLQ write failed; retrying (commits of the partition wait for it)")
		}
		if !backoff.Wait(ctx) {
			return false
		}
	}
	return true
}

// traceContext is the record's W3C trace context (schema.TraceContext),
// which its result and rows pass on.
func traceContext(hs []kafka.Header) []schema.Header {
	var in []schema.Header
	for _, h := range hs {
		if h.Key == schema.HeaderTraceParent || h.Key == schema.HeaderTraceState {
			in = append(in, schema.Header{Key: h.Key, Value: h.Value})
		}
	}
	return schema.TraceContext(in)
}

// deadLetters builds the DLQ records: the original key, value, headers and
// timestamp plus where the record came from and why it failed.
func deadLetters(dead []deadRecord) []schema.DeadLetter {
	dls := make([]schema.DeadLetter, len(dead))
	for i, d := range dead {
		m := d.r.msg
		hs := make([]schema.Header, len(m.Headers))
		for j, h := range m.Headers {
			hs[j] = schema.Header{Key: h.Key, Value: h.Value}
		}
		dls[i] = schema.DeadLetter{
			Key: m.Key, Value: m.Value, Headers: hs, Timestamp: m.Time,
			Topic: m.Topic, Partition: m.Partition, Offset: m.Offset, Generation: d.r.gen.id,
			Stage: d.stage, Reason: d.reason, ExceptionClass: d.class, Message: d.message,
		}
	}
	return dls
}

// ackDead records that d's dead letter was acknowledged and acknowledges
// its record.
func (pr *processor) ackDead(d deadRecord) {
	pr.m.dlq.WithLabelValues(d.reason).Inc()
	pr.deadLettered.Add(1)
	pr.log.Info().Int("partition", d.r.msg.Partition).Int64("offset", d.r.msg.Offset).
		Str("stage", d.stage).Str("reason", d.reason).Msg("record dead-lettered")
	pr.settle(d.r, true)
}
