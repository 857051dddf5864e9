package consumer

import (
	"context"
	"errors"
	"time"

	"github.com/segmentio/kafka-go"
)

// While the input topic does not exist, kafka-go (v0.4.51) cannot hold a
// generation: its partition watcher (consumergroup.go, partitionWatcher)
// returns when its first metadata read answers UNKNOWN_TOPIC_OR_PARTITION,
// which ends the generation as soon as it started, and kafka-go joins the
// next one at once, without its JoinGroupBackoff (that is only for a join
// that failed). Left alone the member rejoins hundreds of times a second,
// two log lines and a rebalance of the whole group each, until the topic
// is back. So a generation that ended with no partitions is followed by a
// look at the topic, and while it is missing the group's next dial waits
// (groupCloser.holdRejoin), longer each time up to missingBackoffMax.
// kafka-go can be one generation ahead (it joins the next while the
// manager of one that ended before it started still runs), so a step may
// see two generations: tens in a minute instead of thousands.

const (
	missingBackoffMin = 500 * time.Millisecond
	missingBackoffCap = 5 * time.Second
)

// missingBackoffMax is the longest wait before a rejoin while the topic is
// missing, and so about the longest a re-created topic waits for the group
// to form again. The member stopped heartbeating when its generation ended:
// a wait near the session timeout would have it dropped from the group,
// and its rejoin fail as an unknown member.
func (cfg Config) missingBackoffMax() time.Duration {
	return max(min(missingBackoffCap, cfg.SessionTimeout/3), missingBackoffMin)
}

// holdIfTopicMissing looks whether the input topic exists after a
// generation that ended with no partitions of it, and if it does not,
// holds the group's next join back by the next backoff step.
func (c *Consumer) holdIfTopicMissing(ctx context.Context, leave *groupCloser, gen int32) {
	ctx, cancel := context.WithTimeout(ctx, max(c.cfg.rebalanceCommitBudget(), time.Second))
	defer cancel()
	missing, err := c.inputTopicMissing(ctx)
	if err != nil {
		// Unknown: neither hold nor clear. A broker that cannot be
		// reached fails the join itself, which kafka-go backs off.
		return
	}
	if !missing {
		c.topicFound()
		return
	}
	step := min(max(2*time.Duration(c.missingStep.Load()), missingBackoffMin), c.cfg.missingBackoffMax())
	c.missingStep.Store(int64(step))
	c.topicMissing.Store(true)
	c.m.topicMissing.Set(1)
	leave.holdRejoin(time.Now().Add(step))
	c.log.Warn().Int32("generation", gen).Dur("backoff", step).
		Msg("input topic does not exist: waiting before rejoining the group")
}

// topicFound ends the backoff once the input topic is known to exist.
func (c *Consumer) topicFound() {
	c.missingStep.Store(0)
	if c.topicMissing.Swap(false) {
		c.m.topicMissing.Set(0)
		c.log.Info().Msg("input topic exists again")
	}
}

// inputTopicMissing asks the bootstrap brokers, in turn, for the input
// topic's partitions, as kafka-go's watcher does; it reports whether the
// first broker that answered said the topic does not exist.
func (c *Consumer) inputTopicMissing(ctx context.Context) (bool, error) {
	d := c.cfg.kafkaDialer()
	var errs []error
	for _, b := range c.cfg.Brokers {
		conn, err := d.DialContext(ctx, "tcp", b)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if dl, ok := ctx.Deadline(); ok {
			_ = conn.SetDeadline(dl)
		}
		_, err = conn.ReadPartitions(c.cfg.Topic)
		_ = conn.Close()
		switch {
		case err == nil:
			return false, nil
		case errors.Is(err, kafka.UnknownTopicOrPartition):
			return true, nil
		}
		errs = append(errs, err)
	}
	return false, errors.Join(errs...)
}

// holdRejoin makes the group's dials wait until t (see waitRejoin).
func (g *groupCloser) holdRejoin(t time.Time) {
	g.rejoinAt.Store(t.UnixNano())
}

// waitRejoin waits, before one of the group's dials, until the time
// holdRejoin set: the next dial after a generation is the next join's.
// kafka-go may have begun that join before the manager of a generation
// that ended at once set the hold, so a hold set during the wait extends
// it. Half the dial's own timeout is always left to the dial. A dial that
// starts once the group is closing is the leave's and does not wait; a
// join held back when closing starts is refused, with the rest of its
// round (see refuseRejoin): let through, it would join a generation only
// for the close to leave it, and wait in JoinGroup for the other members
// meanwhile.
func (g *groupCloser) waitRejoin(ctx context.Context) error {
	select {
	case <-g.stopping:
		return nil
	default:
	}
	limit := time.Now().Add(time.Hour)
	if dl, ok := ctx.Deadline(); ok {
		limit = time.Now().Add(time.Until(dl) / 2)
	}
	for {
		until := time.Unix(0, g.rejoinAt.Load())
		if until.After(limit) {
			until = limit
		}
		wait := time.Until(until)
		if wait <= 0 {
			return nil
		}
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-g.stopping:
			t.Stop()
			g.refuseRejoin()
			g.takeRefusal()
			return errNoRejoin
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		}
	}
}
