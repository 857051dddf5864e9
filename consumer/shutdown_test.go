package consumer

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/scorer/scorer/schema"
)

// slowScorer blocks on the event "slow" until release is closed (or ctx
// ends) and reports through entered when it starts doing so.
func slowScorer() (sc *fakeScorer, entered, release chan struct{}) {
	entered, release = make(chan struct{}), make(chan struct{})
	var once sync.Once
	sc = &fakeScorer{hook: func(ctx context.Context, evs []schema.TranscriptEvent) error {
		for _, e := range evs {
			if e.CallID == "slow" {
				once.Do(func() { close(entered) })
				select {
				case <-release:
				case <-ctx.Done():
					return ctx.Err()
				}
			}
		}
		return nil
	}}
	return sc, entered, release
}

// startSlow produces "a" then "slow" to a one-partition topic, starts a
// consumer and returns once "a" is committed and "slow" is being scored.
func startSlow(t *testing.T, brokers []string, topic, group string, cfg Config) (*running, chan struct{}) {
	t.Helper()
	produce(t, brokers, topic, []kafka.Message{eventMsg(0, "a"), eventMsg(0, "slow")})
	sc, entered, release := slowScorer()
	cfg.BatchMaxMessages = 1
	r := start(t, cfg, sc, &fakeSink{}, testHooks{})
	select {
	case <-entered:
	case <-time.After(20 * time.Second):
		t.Fatal("slow event never reached the scorer")
	}
	eventually(t, 10*time.Second, "a committed", func() bool { return committed(t, brokers, group, topic, 1)[0] == 1 })
	return r, release
}

// TestHeartbeatsContinueDuringDrain: after the stop signal the member keeps
// heartbeating while it drains in-flight work, so the coordinator cannot
// expire it before the final commit (which then succeeds).
func TestHeartbeatsContinueDuringDrain(t *testing.T) {
	t.Parallel()
	const topic, group = "hbdrain", "g-hbdrain"
	cluster, brokers := newCluster(t, topic, 1)
	var mu sync.Mutex
	var beats []time.Time
	cluster.ControlKey(int16(kmsg.Heartbeat), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		if kreq.(*kmsg.HeartbeatRequest).Group == group {
			mu.Lock()
			beats = append(beats, time.Now())
			mu.Unlock()
		}
		return nil, nil, false
	})
	r, release := startSlow(t, brokers, topic, group, testConfig(brokers, topic, group))
	t0 := time.Now()
	time.AfterFunc(2*time.Second, func() { close(release) })
	r.stop(t)
	if d := time.Since(t0); d < 2*time.Second {
		t.Fatalf("Run returned after %v, before the in-flight record finished", d)
	}
	mu.Lock()
	n := 0
	for _, b := range beats {
		if b.After(t0.Add(400*time.Millisecond)) && b.Before(t0.Add(2*time.Second)) {
			n++
		}
	}
	mu.Unlock()
	if n < 3 {
		t.Errorf("%d heartbeats during the 2 s drain (interval 200 ms), want >= 3", n)
	}
	if c := committed(t, brokers, group, topic, 1)[0]; c != 2 {
		t.Errorf("committed %d after the drain, want 2", c)
	}
}

// TestShutdownLeavesWithoutRejoining: a stopping member leaves the group
// right after its final commit and never sends another JoinGroup (which
// would make the other members rebalance for nothing).
func TestShutdownLeavesWithoutRejoining(t *testing.T) {
	t.Parallel()
	const topic, group = "leave", "g-leave"
	cluster, brokers := newCluster(t, topic, 1)
	var stopping atomic.Bool
	joinsAfter, leaves := watchGroup(cluster, group, &stopping)
	produce(t, brokers, topic, []kafka.Message{eventMsg(0, "a"), eventMsg(0, "b")})
	r := start(t, testConfig(brokers, topic, group), &fakeScorer{}, &fakeSink{}, testHooks{})
	eventually(t, 20*time.Second, "committed to end", func() bool { return committed(t, brokers, group, topic, 1)[0] == 2 })
	stopping.Store(true)
	r.stop(t)
	if leaves.Load() == 0 {
		t.Error("no LeaveGroup before Run returned")
	}
	time.Sleep(500 * time.Millisecond) // a rejoin would have been sent by now
	if n := joinsAfter.Load(); n != 0 {
		t.Errorf("%d JoinGroup requests after the stop signal, want 0", n)
	}
}

// TestShutdownBoundedWhenFinalCommitHangs: with the coordinator not
// answering the final commit, Run still returns within ShutdownTimeout
// (plus a small margin), not after the commit's 10 s connection timeout.
func TestShutdownBoundedWhenFinalCommitHangs(t *testing.T) {
	t.Parallel()
	const topic, group = "hang", "g-hang"
	cluster, brokers := newCluster(t, topic, 1)
	var stopping atomic.Bool
	hang := make(chan struct{})
	cluster.ControlKey(int16(kmsg.OffsetCommit), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		if kreq.(*kmsg.OffsetCommitRequest).Group == group && stopping.Load() {
			cluster.SleepControl(func() {
				select {
				case <-hang:
				case <-time.After(15 * time.Second):
				}
			})
		}
		return nil, nil, false
	})
	t.Cleanup(func() { close(hang) })
	cfg := testConfig(brokers, topic, group)
	cfg.ShutdownTimeout = 2 * time.Second
	r, release := startSlow(t, brokers, topic, group, cfg)
	stopping.Store(true)
	t0 := time.Now()
	time.AfterFunc(200*time.Millisecond, func() { close(release) })
	r.stop(t)
	if d := time.Since(t0); d > cfg.ShutdownTimeout+1500*time.Millisecond {
		t.Errorf("Run returned %v after the stop signal, ShutdownTimeout %v", d, cfg.ShutdownTimeout)
	}
}

// TestInflightSettledForQueuedBatches: batches still queued for the workers
// when the pipeline stops leave the in-flight count, so it returns to 0.
func TestInflightSettledForQueuedBatches(t *testing.T) {
	t.Parallel()
	c, err := New(testConfig([]string{"127.0.0.1:1"}, "t", "g"), &fakeScorer{}, &fakeSink{}, zerolog.Nop(), nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	g := &genState{parts: map[int]*partState{}, ctx: ctx, cancel: cancel}
	ps := newPartState(0, -1)
	for b := range c.cfg.MaxInflightBatches {
		var recs []*record
		for i := range 3 {
			c.addInflight(1)
			g.pending.Add(1)
			recs = append(recs, &record{msg: kafka.Message{Offset: int64(b*3 + i)}, gen: g, ps: ps, done: func() {}})
		}
		c.pipe.slots <- struct{}{}
		c.pipe.work <- sequence(recs)
	}
	wait := c.pipe.start(ctx)
	if !wait(time.Now().Add(5 * time.Second)) {
		t.Fatal("pipeline did not stop")
	}
	if s := c.Stats(); s.Inflight != 0 || g.pending.Load() != 0 {
		t.Errorf("in flight %d, pending %d after the pipeline stopped; want 0", s.Inflight, g.pending.Load())
	}
}
