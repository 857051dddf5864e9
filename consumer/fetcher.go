package consumer

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/scorer/scorer/internal/retry"
	"github.com/scorer/scorer/schema"
)

// Why a franz-go client fetches while kafka-go keeps the group: see
// kafkaclients.go.

// fetchOptions are the kgo options of the client that fetches partition
// from offset (kafka.FirstOffset and kafka.LastOffset as kafka-go means
// them).
func (c *Consumer) fetchOptions(partition int, offset int64) []kgo.Opt {
	at := kgo.NewOffset().At(offset)
	switch offset {
	case kafka.FirstOffset:
		at = kgo.NewOffset().AtStart()
	case kafka.LastOffset:
		at = kgo.NewOffset().AtEnd()
	}
	isolation := kgo.ReadCommitted()
	if c.cfg.ReadUncommitted {
		isolation = kgo.ReadUncommitted()
	}
	// Room for one record of the largest size we accept (plus framing) so
	// an oversized record reaches the DLQ path.
	maxBytes := int32(min(c.cfg.MaxMessageBytes+schema.FetchSlack, 1<<30))
	return append(c.cfg.kgoConnOpts(),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{c.cfg.Topic: {int32(partition): at}}),
		kgo.FetchIsolationLevel(isolation),
		// OFFSET_OUT_OF_RANGE comes back to fetch, which places the read
		// position exactly (see resumePoint). franz-go's own reset lists
		// the log start when the cursor has consumed nothing yet (a
		// truncated idle partition read again whole, silently) and a
		// record timestamp otherwise, which producer-set CreateTime can put
		// past the lost offsets.
		kgo.ConsumeResetOffset(kgo.NoResetOffset()),
		kgo.FetchMinBytes(1),
		kgo.FetchMaxBytes(maxBytes),
		kgo.FetchMaxPartitionBytes(maxBytes),
		kgo.FetchMaxWait(c.cfg.FetchMaxWait),
		kgo.RetryBackoffFn(func(tries int) time.Duration {
			return min(c.cfg.RetryBackoff<<min(max(tries-1, 0), 20), c.cfg.RetryBackoffMax)
		}),
		kgo.WithLogger(kgoLogger{c.log.With().Int("partition", partition).Logger()}),
	)
}

// clientCloseTimeout bounds the wait for a fetch client to close.
const clientCloseTimeout = 5 * time.Second

// fetch reads one partition from offset and hands records to the batch
// loop until ctx ends; stopped is called once it hands over no more
// records, before its client is closed. It never returns early on errors:
// the partition would silently stop being read.
//
// The log can move back under it. After a truncation (an unclean leader
// election) franz-go reports ErrDataLoss and reads on from a lower offset;
// the records there are new, so the watermark is rewound to that offset as
// soon as the loss is reported (see lostTo and Watermark.Rewind), the
// commit goes back to it, and the records there are scored. A topic deleted and re-created under the same name (same
// partition count, so no rebalance) is one franz-go never reads again: it
// keeps the old topic ID and answers UNKNOWN_TOPIC_ID for good. fetch then
// reads the new topic with a new client from its start (its end with
// StartOffset = last, as checkOffset resets a position past the log end),
// counted as an offset reset.
func (c *Consumer) fetch(ctx context.Context, g *genState, ps *partState, offset int64, stopped func()) {
	var cl *kgo.Client
	defer func() { c.closeClient(ps, cl) }()
	defer stopped() // runs before the client is closed
	offset = c.checkOffset(ctx, ps, offset)
	var err error
	if cl, err = kgo.NewClient(c.fetchOptions(ps.partition, offset)...); err != nil {
		// Only invalid options fail here, and Validate rules them out.
		c.log.Error().Err(err).Int("partition", ps.partition).Msg("fetch client")
		<-ctx.Done()
		return
	}
	partLabel := strconv.Itoa(ps.partition)
	// next is the offset the partition is read at (-1: not known yet), to
	// tell records lost to retention from an ordinary gap.
	next := max(offset, -1)
	// id is the ID of the topic cl reads (zero: not known yet), to tell a
	// re-created topic from a broker that does not know the topic yet.
	// Fetches name it, a failed one too (the ID cl asked with), and cl
	// never adopts another; the broker's answer at the start stands in
	// until a fetch comes, and is replaced then: cl fetches from its
	// creation on, so a topic re-created meanwhile has the new ID there
	// while cl keeps the old one, and that ID kept would never differ
	// from the broker's.
	id := c.topicID(ctx, cl)
	backoff := retry.New(c.cfg.RetryBackoff, c.cfg.RetryBackoffMax)
	for {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil || fs.IsClientClosed() {
			return
		}
		failed, unknownID, outOfRange := false, false, false
		fs.EachError(func(_ string, _ int32, err error) {
			var lost *kgo.ErrDataLoss
			if errors.As(err, &lost) {
				c.offsetReset(ps, err.Error())
				c.lostTo(ps, lost)
				return
			}
			outOfRange = outOfRange || errors.Is(err, kerr.OffsetOutOfRange)
			unknownID = unknownID || errors.Is(err, kerr.UnknownTopicID)
			failed = true
			c.m.fetchErrors.WithLabelValues(c.cfg.Topic, partLabel).Inc()
			c.log.Warn().Err(err).Int("partition", ps.partition).Msg("fetch failed; retrying")
		})
		// A failed fetch can still carry records: franz-go returns those
		// decoded before a bad batch (a CRC mismatch, a truncated batch)
		// with the error and reads on from the bad batch, so dropping them
		// here would lose them for good, the commit moving past them. They
		// are handed over first, and the backoff follows.
		fs.EachTopic(func(t kgo.FetchTopic) {
			if t.TopicID != ([16]byte{}) {
				id = t.TopicID
			}
		})
		if !c.handOver(ctx, g, ps, fs, partLabel, &next) {
			return
		}
		if unknownID {
			if now := c.topicID(ctx, cl); now != ([16]byte{}) && id != ([16]byte{}) && now != id {
				start, from := kafka.FirstOffset, "start"
				if c.cfg.StartOffset == kafka.LastOffset {
					start, from = kafka.LastOffset, "end"
				}
				c.offsetReset(ps, fmt.Sprintf("the topic was deleted and re-created (topic ID %x, was %x); reading the new topic from its %s",
					now, id, from))
				c.closeClient(ps, cl)
				// A new topic's offsets start at 0: whatever is still in
				// flight from the old one must not hold the commit above
				// the new records.
				ps.wm.Rewind(0)
				if cl, err = kgo.NewClient(c.fetchOptions(ps.partition, start)...); err != nil {
					c.log.Error().Err(err).Int("partition", ps.partition).Msg("fetch client")
					<-ctx.Done()
					return
				}
				id, next = now, -1
				backoff.Reset()
				continue
			}
		}
		if outOfRange {
			// Under NoResetOffset the client keeps the partition failed:
			// a new one reads on from the exact point.
			to, err := c.resumePoint(ctx, ps, next)
			if err != nil {
				c.log.Warn().Err(err).Int("partition", ps.partition).Int64("offset", next).
					Msg("read position out of the partition's log, and the log's range could not be read; retrying")
				if !backoff.Wait(ctx) {
					return
				}
			}
			c.closeClient(ps, cl)
			if cl, err = kgo.NewClient(c.fetchOptions(ps.partition, to)...); err != nil {
				c.log.Error().Err(err).Int("partition", ps.partition).Msg("fetch client")
				<-ctx.Done()
				return
			}
			next = max(to, -1)
			continue
		}
		if failed {
			if !backoff.Wait(ctx) {
				return
			}
			continue
		}
		backoff.Reset()
	}
}

// resumePoint is where to read the partition on after its leader answered
// OFFSET_OUT_OF_RANGE at next (-1: the client's first position, a log
// start or end it resolved itself). The point is exact, never a time guess:
// below the log start (retention deleted records not yet read) the start;
// past the log end (an unclean leader election cut the log back under a
// reader of the same topic; a re-created one is told by its topic ID) the
// end, whatever StartOffset says: the log start would score again every
// record below the cut, all scored before. Records written at the cut
// before the end was read here are skipped; without the leader epoch of the
// committed offset (kafka-go commits none) no reader can place the cut
// itself. Inside the log (an answer from a replica behind) next stands. A
// moved position is counted as an offset reset and committed at once (see
// resetTo). On an error next is returned with it.
func (c *Consumer) resumePoint(ctx context.Context, ps *partState, next int64) (int64, error) {
	if next < 0 {
		return c.cfg.StartOffset, nil
	}
	first, last, err := c.logRange(ctx, ps)
	if err != nil {
		return next, err
	}
	to := next
	switch {
	case next < first:
		to = first
		c.offsetReset(ps, fmt.Sprintf("offsets %d to %d were deleted before they were read; reading on from the log start %d", next, first-1, first))
	case next > last:
		to = last
		c.offsetReset(ps, fmt.Sprintf("the log was cut back to %d under the read position %d (an unclean leader election); reading on from its end %d", last, next, last))
	default:
		return next, nil
	}
	c.resetTo(ps, to)
	return to, nil
}

// lostTo rewinds the partition's watermark to where franz-go resumed after
// the log lost records under it (an unclean leader election), and asks for
// that offset to be committed now.
//
// Not when the first record there arrives: the partition may be idle, and
// until a record comes the commit would stay at the old, higher offset. The
// next owner (a rebalance, a restart) would then resume there and never
// read the records written after the election at the offsets lost, or,
// with the log end still below the old offset, reset to the log start and
// replay all of it. franz-go reports the loss in a fetch of its own, before
// any fetch from the reset point (Fetches lists its records first, but the
// errors are read first here), so nothing from there on is tracked yet.
//
// A commit moving back is harmless to Kafka: it keeps whatever offset a
// member of the current generation writes, and the coordinator refuses
// commits of an older generation (ILLEGAL_GENERATION), so no former owner
// can write a stale offset over it and no later owner sees it except as
// where to read. Within this generation commits run one at a time, each
// from the watermark as it is when it starts (see commitOffsets); a commit
// in flight with the old offset is followed by one with the new. Old
// records still in flight resolve to the reset point at most (see
// Watermark.Rewind), so the commit cannot move past the new records before
// they are scored. With nothing in flight the reset point is committable at
// once (Watermark.ResetTo), even when nothing was resolved in this
// generation; otherwise the commit follows once the old records in flight
// resolve (to the reset point).
func (c *Consumer) lostTo(ps *partState, lost *kgo.ErrDataLoss) {
	if lost.Topic != c.cfg.Topic || int(lost.Partition) != ps.partition || lost.ResetTo < 0 {
		return
	}
	c.resetTo(ps, lost.ResetTo)
}

// resetTo moves the partition's watermark to a reset read position (see
// Watermark.ResetTo) and asks for it to be committed now, as lostTo says why.
func (c *Consumer) resetTo(ps *partState, offset int64) {
	ps.wm.ResetTo(offset)
	if next, ok := ps.wm.Committable(); ok && next != ps.committed.Load() {
		select {
		case ps.commitNow <- struct{}{}:
		default: // a request is already waiting
		}
	}
}

// closeClient closes cl, waiting at most clientCloseTimeout.
func (c *Consumer) closeClient(ps *partState, cl *kgo.Client) {
	if cl == nil {
		return
	}
	done := make(chan struct{})
	go func() { cl.Close(); close(done) }()
	if !waitChan(done, time.Now().Add(clientCloseTimeout)) {
		c.log.Warn().Int("partition", ps.partition).Msg("fetch client close timed out")
	}
}

// topicID asks the broker for the input topic's ID, zero when it does not
// know the topic (or did not answer in time).
func (c *Consumer) topicID(ctx context.Context, cl *kgo.Client) [16]byte {
	ctx, cancel := context.WithTimeout(ctx, offsetCheckTimeout)
	defer cancel()
	req := kmsg.NewPtrMetadataRequest()
	t := kmsg.NewMetadataRequestTopic()
	t.Topic = kmsg.StringPtr(c.cfg.Topic)
	req.Topics = append(req.Topics, t)
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return [16]byte{}
	}
	for _, rt := range resp.Topics {
		if rt.Topic != nil && *rt.Topic == c.cfg.Topic && rt.ErrorCode == 0 {
			return rt.TopicID
		}
	}
	return [16]byte{}
}

// handOver tracks the records of one poll in the partition's watermark and
// hands them to the batch loop, in offset order; next is the offset the
// partition is read at (see fetch). It reports false if ctx ended first.
func (c *Consumer) handOver(ctx context.Context, g *genState, ps *partState, fs kgo.Fetches, partLabel string, next *int64) bool {
	var recs []*kgo.Record
	fs.EachPartition(func(p kgo.FetchTopicPartition) {
		if len(p.Records) == 0 {
			return
		}
		ps.logEnd.Store(p.HighWatermark)
		if first := p.Records[0].Offset; *next >= 0 && first > *next && p.LogStartOffset > *next {
			c.offsetReset(ps, fmt.Sprintf("offsets %d to %d were deleted before they were read; reading on from %d",
				*next, p.LogStartOffset-1, first))
		}
		*next = p.Records[len(p.Records)-1].Offset + 1
		recs = append(recs, p.Records...)
	})
	for _, kr := range recs {
		c.messagesIn.Add(1)
		c.m.messagesIn.WithLabelValues(c.cfg.Topic).Inc()
		ps.gauges(func() {
			c.m.lag.WithLabelValues(c.cfg.Topic, partLabel).Set(float64(max(ps.logEnd.Load()-kr.Offset-1, 0)))
		})
		ps.first.CompareAndSwap(-1, kr.Offset)
		if !c.waitSpan(ctx, ps) {
			return false
		}
		done, err := ps.wm.Track(kr.Offset)
		if err != nil {
			// One client hands over an offset at or below one it handed
			// over before only after resetting its position back: the log
			// was truncated under it (ErrDataLoss), and the records there
			// now are new ones, not repeats. lostTo rewound the watermark
			// when franz-go reported the loss; this catches a move back
			// reported otherwise or not at all.
			c.log.Warn().Int("partition", ps.partition).Int64("offset", kr.Offset).
				Msg("the partition's log moved back under its reader; scoring again from this offset, the commit goes back to it")
			ps.wm.Rewind(kr.Offset)
			if done, err = ps.wm.Track(kr.Offset); err != nil {
				c.log.Error().Err(err).Int("partition", ps.partition).Int64("offset", kr.Offset).Msg("record not tracked after a rewind")
				continue
			}
		}
		rec := &record{msg: message(kr), gen: g, ps: ps, done: done}
		c.addInflight(1)
		g.pending.Add(1)
		select {
		case c.pipe.in <- rec:
		case <-ctx.Done():
			// Never handed over: it stays unresolved, so the commit stops
			// before it and the next owner reads it again.
			c.addInflight(-1)
			g.pending.Add(-1)
			return false
		}
	}
	return true
}

// message is r as the pipeline carries records. An empty value reads as a
// null one, a tombstone: kafka-go, which fetched before, could not tell
// them apart, and the keyed output's deletes rely on it.
func message(r *kgo.Record) kafka.Message {
	value := r.Value
	if len(value) == 0 {
		value = nil
	}
	hs := make([]kafka.Header, len(r.Headers))
	for i, h := range r.Headers {
		hs[i] = kafka.Header{Key: h.Key, Value: h.Value}
	}
	return kafka.Message{
		Topic: r.Topic, Partition: int(r.Partition), Offset: r.Offset,
		Key: r.Key, Value: value, Headers: hs, Time: r.Timestamp,
	}
}
