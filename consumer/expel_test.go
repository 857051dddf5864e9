package consumer

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/scorer/scorer/internal/kafkatest"
	"github.com/scorer/scorer/schema"
)

// TestExpelledMemberPublishesNothing: while a record is being scored, the
// coordinator expels the member (its heartbeat and then its commit are
// answered UNKNOWN_MEMBER_ID, as after a session expired during a long
// pause). kafka-go drops the heartbeat error and just ends the generation;
// the consumer asks the coordinator with a commit, learns it was expelled,
// and abandons the generation's work at once. The scoring finishes soon
// after, within what the drain would have waited, yet nothing of the
// expelled generation is published: the record is published only by the
// next generation. Before, the drain published it as in any rebalance.
func TestExpelledMemberPublishesNothing(t *testing.T) {
	t.Parallel()
	const topic, group = "expel", "g-expel"
	c, brokers := newCluster(t, topic, 1)
	produce(t, brokers, topic, []kafka.Message{eventMsg(0, "first"), eventMsg(0, "held")})
	entered, release := make(chan struct{}), make(chan struct{})
	var held atomic.Bool
	sc := &fakeScorer{hook: func(ctx context.Context, evs []schema.TranscriptEvent) error {
		if evs[0].CallID != "held" || !held.CompareAndSwap(false, true) {
			return nil
		}
		close(entered)
		select { // finishes when released, even if its ctx ended: as a scorer that ignores ctx
		case <-release:
		case <-time.After(20 * time.Second):
		}
		return nil
	}}
	sk := &fakeSink{}
	cfg := testConfig(brokers, topic, group)
	cfg.BatchMaxMessages = 1
	r := start(t, cfg, sc, sk, testHooks{})
	select {
	case <-entered:
	case <-time.After(20 * time.Second):
		t.Fatal("held never reached the scorer")
	}
	eventually(t, 10*time.Second, "first published", func() bool { return countIDs(sk.Published())["first"] == 1 })

	var expel, heartbeatFailed, commitFailed atomic.Bool
	c.ControlKey(kmsg.Heartbeat.Int16(), func(req kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		if !expel.Load() || !heartbeatFailed.CompareAndSwap(false, true) {
			return nil, nil, false
		}
		resp := req.(*kmsg.HeartbeatRequest).ResponseKind().(*kmsg.HeartbeatResponse)
		resp.ErrorCode = kerr.UnknownMemberID.Code
		return resp, nil, true
	})
	c.ControlKey(kmsg.OffsetCommit.Int16(), func(req kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		if !heartbeatFailed.Load() || !commitFailed.CompareAndSwap(false, true) {
			return nil, nil, false
		}
		return kafkatest.OffsetCommitError(req.(*kmsg.OffsetCommitRequest), kerr.UnknownMemberID.Code), nil, true
	})
	expel.Store(true)
	eventually(t, 10*time.Second, "heartbeat failed", heartbeatFailed.Load)
	time.Sleep(500 * time.Millisecond)
	close(release) // well within RevokeTimeout: a drain would publish it now

	eventually(t, 30*time.Second, "held published by the next generation", func() bool { return countIDs(sk.Published())["held"] > 0 })
	time.Sleep(300 * time.Millisecond) // give a late publish every chance
	for _, res := range sk.Published() {
		if res.CallID == "held" && res.Source.Generation == 1 {
			t.Fatalf("held published by the expelled generation 1: %+v", res.Source)
		}
	}
	if n := r.c.Stats().Expulsions; n != 1 {
		t.Fatalf("expulsions = %d, want 1", n)
	}
}

// TestExpulsionSeenByPeriodicCommit: the coordinator answers a periodic
// commit UNKNOWN_MEMBER_ID while heartbeats still succeed. The member
// abandons the generation and rejoins at once, instead of fetching on, with
// nothing published, until some heartbeat fails: records produced after
// the expulsion are published by its next generation.
func TestExpulsionSeenByPeriodicCommit(t *testing.T) {
	t.Parallel()
	const topic, group = "expel-commit", "g-expel-commit"
	c, brokers := newCluster(t, topic, 1)
	produce(t, brokers, topic, []kafka.Message{eventMsg(0, "a")})
	sk := &fakeSink{}
	r := start(t, testConfig(brokers, topic, group), &fakeScorer{}, sk, testHooks{})
	eventually(t, 20*time.Second, "a committed", func() bool { return committed(t, brokers, group, topic, 1)[0] == 1 })

	var expel, failed atomic.Bool
	c.ControlKey(kmsg.OffsetCommit.Int16(), func(req kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		if !expel.Load() || !failed.CompareAndSwap(false, true) {
			return nil, nil, false
		}
		return kafkatest.OffsetCommitError(req.(*kmsg.OffsetCommitRequest), kerr.UnknownMemberID.Code), nil, true
	})
	expel.Store(true)
	produce(t, brokers, topic, []kafka.Message{eventMsg(0, "b")})
	eventually(t, 20*time.Second, "expelled by a commit", func() bool { return r.c.Stats().Expulsions == 1 })
	produce(t, brokers, topic, []kafka.Message{eventMsg(0, "c")})
	eventually(t, 20*time.Second, "c published after the expulsion", func() bool { return countIDs(sk.Published())["c"] > 0 })
	if s := r.c.Stats(); s.Generations < 2 {
		t.Errorf("generations %d: the member did not rejoin", s.Generations)
	}
}
