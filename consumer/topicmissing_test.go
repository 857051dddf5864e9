package consumer

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// TestTopicDeletedNoSpin deletes the input topic under a member holding a
// generation and leaves it deleted for a while. kafka-go's partition
// watcher fails its first metadata read of a missing topic and so ends
// every generation as soon as it starts, and kafka-go rejoins at once: the
// group must not spin through generations (the soak saw 1 082 in 20 s),
// the member must not read as ready, and once the topic is back the group
// must form and score again.
func TestTopicDeletedNoSpin(t *testing.T) {
	t.Parallel()
	const topic, group = "deleted", "g-deleted"
	cluster, brokers := newCluster(t, topic, 1)
	var joins atomic.Int32
	cluster.ControlKey(int16(kmsg.JoinGroup), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		if kreq.(*kmsg.JoinGroupRequest).Group == group {
			joins.Add(1)
		}
		return nil, nil, false // observe only
	})
	cfg := testConfig(brokers, topic, group)
	// The watcher notices the deletion at its next tick; the default 5 s
	// would spend most of the test before the first generation ends.
	cfg.PartitionWatchInterval = 200 * time.Millisecond
	sk := &fakeSink{}
	r := start(t, cfg, &fakeScorer{}, sk, testHooks{})
	eventually(t, 20*time.Second, "the partition assigned", func() bool { return r.c.Stats().Assigned == 1 })

	if err := cluster.DeleteTopic(topic); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "the generation ended by the deletion", func() bool { return r.c.Stats().Assigned == 0 })
	joined, gens := joins.Load(), r.c.Stats().Generations
	const window = 4 * time.Second
	time.Sleep(window)
	joined, gens = joins.Load()-joined, r.c.Stats().Generations-gens
	t.Logf("topic missing for %v: %d JoinGroup requests, %d generations", window, joined, gens)
	// A backoff that starts short and doubles allows a handful.
	if joined > 10 || gens > 10 {
		t.Errorf("topic missing for %v: %d JoinGroup requests and %d generations, want at most 10 each", window, joined, gens)
	}
	if r.c.Ready() {
		t.Error("ready while the input topic is missing")
	}

	if err := cluster.CreateTopic(topic, 1, nil); err != nil {
		t.Fatal(err)
	}
	produce(t, brokers, topic, msgsFor(0, callIDs("back", 1)))
	eventually(t, 15*time.Second, "the re-created topic's record published", func() bool {
		return countIDs(sk.Published())["back-0"] == 1
	})
	eventually(t, 5*time.Second, "ready again", r.c.Ready)
}

// TestTopicDeletedShutdownWhileHeld stops a member while its rejoin is
// held back because the input topic is missing: it must leave without
// joining another generation, and Run return promptly.
func TestTopicDeletedShutdownWhileHeld(t *testing.T) {
	t.Parallel()
	const topic, group = "deleted-stop", "g-deleted-stop"
	cluster, brokers := newCluster(t, topic, 1)
	var stopping atomic.Bool
	joinsAfter, leaves := watchGroup(cluster, group, &stopping)
	cfg := testConfig(brokers, topic, group)
	cfg.PartitionWatchInterval = 200 * time.Millisecond
	// A session long enough for backoff steps of several seconds.
	cfg.SessionTimeout, cfg.RebalanceTimeout = 30*time.Second, 30*time.Second
	r := start(t, cfg, &fakeScorer{}, &fakeSink{}, testHooks{})
	eventually(t, 20*time.Second, "the partition assigned", func() bool { return r.c.Stats().Assigned == 1 })
	if err := cluster.DeleteTopic(topic); err != nil {
		t.Fatal(err)
	}
	// By the third step the hold is 2 s, and most of the time is spent in it.
	eventually(t, 15*time.Second, "a 2 s hold", func() bool { return r.c.missingStep.Load() >= int64(2*time.Second) })
	time.Sleep(300 * time.Millisecond)

	stopping.Store(true)
	begun := time.Now()
	r.stop(t)
	if took := time.Since(begun); took > 2*time.Second {
		t.Errorf("Run took %v to return", took)
	}
	if n := joinsAfter.Load(); n != 0 {
		t.Errorf("%d JoinGroup requests after the stop, want 0", n)
	}
	eventually(t, 5*time.Second, "the group left", func() bool { return leaves.Load() >= 1 })
}
