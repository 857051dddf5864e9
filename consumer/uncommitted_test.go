package consumer

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/scorer/scorer/internal/kafkatest"
)

// TestMaxUncommittedHoldsWhileCommitsFail: the coordinator refuses every
// offset commit (COORDINATOR_NOT_AVAILABLE, as with __consumer_offsets
// below min.insync.replicas) while heartbeats succeed. Every record is
// scored and published, so none stays in flight, yet each one is replayed
// by a crash: fetching must pause once MaxUncommitted records past the last
// successful commit are out, with the member alive (nothing in flight nor
// stuck) and not ready, and resume when a commit succeeds. Before, the
// count was of records in flight, so all 200 were published with nothing
// committed.
func TestMaxUncommittedHoldsWhileCommitsFail(t *testing.T) {
	t.Parallel()
	const topic, group, total, limit = "commitfail", "g-commitfail", 200, 5
	cluster, brokers := newCluster(t, topic, 1)
	var refuse atomic.Bool
	var refused atomic.Int32
	refuse.Store(true)
	cluster.ControlKey(kmsg.OffsetCommit.Int16(), func(req kmsg.Request) (kmsg.Response, error, bool) {
		cluster.KeepControl()
		if !refuse.Load() {
			return nil, nil, false
		}
		refused.Add(1)
		return kafkatest.OffsetCommitError(req.(*kmsg.OffsetCommitRequest), kerr.CoordinatorNotAvailable.Code), nil, true
	})
	produce(t, brokers, topic, msgsFor(0, callIDs("cf", total)))
	sk := &fakeSink{}
	cfg := testConfig(brokers, topic, group)
	cfg.MaxUncommitted = limit
	c, reg := startMetered(t, cfg, &fakeScorer{}, sk)

	// Paused with nothing in flight, through three refused commits: only
	// the uncommitted records can hold it so long (a pause for records in
	// flight ends within a poll of their acknowledgement).
	since := int32(-1)
	eventually(t, 20*time.Second, "partition held paused with everything fetched acknowledged, or all published", func() bool {
		if len(sk.Published()) == total {
			return true
		}
		if v, _ := gaugeOf(t, reg, "scorer_partition_paused", 0); v != 1 || c.Stats().Inflight != 0 {
			since = -1
			return false
		}
		if since < 0 {
			since = refused.Load()
		}
		return refused.Load() >= since+3
	})
	if n, most := len(sk.Published()), limit+cfg.BatchMaxMessages; n > most {
		t.Fatalf("%d of %d published with every commit refused; want at most MaxUncommitted + BatchMaxMessages = %d", n, total, most)
	}
	eventually(t, 10*time.Second, "a commit refused", func() bool { return c.Stats().CommitErrors > 0 })
	if c.Ready() {
		t.Error("ready while every commit is refused")
	}
	if age := c.OldestAcknowledgement(); age != 0 {
		t.Errorf("OldestAcknowledgement = %v with nothing being written (liveness would fail), want 0", age)
	}
	if n := c.Stats().Inflight; n != 0 {
		t.Errorf("%d records in flight while paused, want 0 (liveness reads it)", n)
	}

	refuse.Store(false)
	eventually(t, 30*time.Second, "committed to the end once commits succeed", func() bool {
		return committed(t, brokers, group, topic, 1)[0] == total
	})
	if n := len(countIDs(sk.Published())); n != total {
		t.Errorf("published %d distinct calls, want %d", n, total)
	}
	eventually(t, 5*time.Second, "ready again", c.Ready)
}
