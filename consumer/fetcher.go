package consumer

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"time"

	"github.com/rs/zerolog"
	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/sasl"
	"github.com/twmb/franz-go/pkg/kgo"
	kgosasl "github.com/twmb/franz-go/pkg/sasl"

	"github.com/scorer/scorer/schema"
)

// Each partition is fetched by a franz-go client of its own (kgo, direct
// partition consumption, no group): kafka-go's Reader does not drop the
// records of aborted transactions even when asked to read committed data
// (segmentio/kafka-go#1332), and exactly-once producers (Flink, Kafka
// Streams, Connect sources) abort transactions. kgo filters them with the
// fetch response's aborted-transaction list and skips the control records.
// Group membership and commits stay with kafka-go's ConsumerGroup.

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
	opts := []kgo.Opt{
		kgo.SeedBrokers(c.cfg.Brokers...),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{c.cfg.Topic: {int32(partition): at}}),
		kgo.FetchIsolationLevel(isolation),
		kgo.FetchMinBytes(1),
		kgo.FetchMaxBytes(maxBytes),
		kgo.FetchMaxPartitionBytes(maxBytes),
		kgo.FetchMaxWait(c.cfg.FetchMaxWait),
		kgo.RetryBackoffFn(func(tries int) time.Duration {
			return min(c.cfg.RetryBackoff<<min(max(tries-1, 0), 20), c.cfg.RetryBackoffMax)
		}),
		kgo.WithLogger(kgoLogger{c.log.With().Int("partition", partition).Logger()}),
	}
	d := c.cfg.Dialer
	if d == nil {
		return append(opts, kgo.ClientID(c.cfg.ClientID))
	}
	opts = append(opts, kgo.ClientID(d.ClientID))
	if d.Timeout > 0 {
		opts = append(opts, kgo.DialTimeout(d.Timeout))
	}
	if d.TLS != nil {
		opts = append(opts, kgo.DialTLSConfig(d.TLS.Clone()))
	}
	if d.SASLMechanism != nil {
		opts = append(opts, kgo.SASL(saslMechanism{d.SASLMechanism}))
	}
	return opts
}

// saslMechanism runs a kafka-go SASL mechanism (what Config.Dialer carries)
// in a kgo client: both drive the same challenge-response exchange.
type saslMechanism struct{ m sasl.Mechanism }

func (s saslMechanism) Name() string { return s.m.Name() }

func (s saslMechanism) Authenticate(ctx context.Context, host string) (kgosasl.Session, []byte, error) {
	if h, p, err := net.SplitHostPort(host); err == nil {
		port, _ := strconv.Atoi(p)
		ctx = sasl.WithMetadata(ctx, &sasl.Metadata{Host: h, Port: port})
	}
	sm, ir, err := s.m.Start(ctx)
	if err != nil {
		return nil, nil, err
	}
	return saslSession{ctx: ctx, sm: sm}, ir, nil
}

type saslSession struct {
	ctx context.Context
	sm  sasl.StateMachine
}

func (s saslSession) Challenge(challenge []byte) (bool, []byte, error) {
	return s.sm.Next(s.ctx, challenge)
}

// kgoLogger writes kgo's warnings and errors at warn level and the rest at
// debug level: a fetch client's own retries are not the operator's news.
type kgoLogger struct{ log zerolog.Logger }

func (l kgoLogger) Level() kgo.LogLevel {
	if l.log.GetLevel() <= zerolog.DebugLevel {
		return kgo.LogLevelInfo
	}
	return kgo.LogLevelWarn
}

func (l kgoLogger) Log(level kgo.LogLevel, msg string, keyvals ...any) {
	ev := l.log.Debug()
	if level <= kgo.LogLevelWarn {
		ev = l.log.Warn()
	}
	ev.Fields(keyvals).Msg("kgo: " + msg)
}

// clientCloseTimeout bounds the wait for a fetch client to close.
const clientCloseTimeout = 5 * time.Second

// fetch reads one partition from offset and hands records to the batch
// loop until ctx ends; stopped is called once it hands over no more
// records, before its client is closed. It never returns early on errors:
// the partition would silently stop being read.
func (c *Consumer) fetch(ctx context.Context, g *genState, ps *partState, offset int64, stopped func()) {
	var cl *kgo.Client
	defer func() {
		if cl == nil {
			return
		}
		done := make(chan struct{})
		go func() { cl.Close(); close(done) }()
		if !waitChan(done, time.Now().Add(clientCloseTimeout)) {
			c.log.Warn().Int("partition", ps.partition).Msg("fetch client close timed out")
		}
	}()
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
	backoff := c.cfg.RetryBackoff
	for {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil || fs.IsClientClosed() {
			return
		}
		failed := false
		fs.EachError(func(_ string, _ int32, err error) {
			var lost *kgo.ErrDataLoss
			if errors.As(err, &lost) {
				c.offsetReset(ps, err.Error())
				return
			}
			failed = true
			c.m.fetchErrors.WithLabelValues(c.cfg.Topic, partLabel).Inc()
			c.log.Warn().Err(err).Int("partition", ps.partition).Msg("fetch failed; retrying")
		})
		// A failed fetch can still carry records: franz-go returns those
		// decoded before a bad batch (a CRC mismatch, a truncated batch)
		// with the error and reads on from the bad batch, so dropping them
		// here would lose them for good, the commit moving past them. They
		// are handed over first, and the backoff follows.
		if !c.handOver(ctx, g, ps, fs, partLabel, &next) {
			return
		}
		if failed {
			if !sleepCtx(ctx, backoff) {
				return
			}
			backoff = min(backoff*2, c.cfg.RetryBackoffMax)
			continue
		}
		backoff = c.cfg.RetryBackoff
	}
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
			c.log.Debug().Err(err).Int("partition", ps.partition).Int64("offset", kr.Offset).Msg("skipping repeated offset")
			continue
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
