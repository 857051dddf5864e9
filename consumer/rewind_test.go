package consumer

import (
	"context"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/scorer/scorer/schema"
)

// TestWatermarkRewind: offsets 10 to 14 are tracked, 10 and 11 resolved,
// then the log is rewound to 11. The commit goes back to 11; the old
// records still in flight at 12 to 14 hold it there when they resolve (the
// log no longer has them), and the new records at 11 and 12 move it on.
func TestWatermarkRewind(t *testing.T) {
	t.Parallel()
	x := newWMTester(t).track(10, 11, 12, 13, 14).resolve(10, 11).want(12, true)
	x.w.Rewind(11)
	x.want(11, true)
	if _, err := x.w.Track(10); err == nil {
		t.Fatal("offset 10, below the rewind, tracked again")
	}
	new11, err := x.w.Track(11)
	if err != nil {
		t.Fatalf("track 11 after the rewind: %v", err)
	}
	new12, err := x.w.Track(12)
	if err != nil {
		t.Fatalf("track 12 after the rewind: %v", err)
	}
	if n := x.w.Pending(); n != 5 {
		t.Fatalf("pending %d, want 5 (3 old, 2 new)", n)
	}
	x.resolve(12, 13, 14).want(11, true)
	new12()
	x.want(11, true) // new 11 still in flight
	new11()
	x.want(13, true)

	// A rewind before anything was resolved: the old records resolve to
	// the rewind point, not past it.
	y := newWMTester(t).track(5, 6)
	y.w.Rewind(0)
	y.want(0, false)
	y.resolve(5, 6).want(0, true)
}

// TestTruncatedLogReadAgain: after 50 records were scored and committed, the
// partition's leader answers the fetch at 50 OFFSET_OUT_OF_RANGE and lists
// its log end at 40, as after an unclean leader election that lost offsets
// 40 to 49. franz-go reports the data loss and reads on from 40; what is at
// 40 to 49 now is new to the scorer (here the same records stand in for
// the new ones) and must be scored again, not skipped as repeats. While
// they are in flight the committed offset must go back to 40 rather than
// stay at 50, where a crash or a rebalance would resume past them.
func TestTruncatedLogReadAgain(t *testing.T) {
	t.Parallel()
	const topic, group = "truncated", "g-truncated"
	_, brokers, armed, reread := truncatedAt50(t, topic)
	// The records read again are held in flight until the commit was seen
	// back at 40.
	release := make(chan struct{})
	sk := &fakeSink{}
	c, _ := startMetered(t, testConfig(brokers, topic, group), holdReread(reread, release), sk)
	eventually(t, 20*time.Second, "the first 50 committed", func() bool { return committed(t, brokers, group, topic, 1)[0] == 50 })
	produce(t, brokers, topic, msgsFor(0, callIDs("after", 5)))
	close(armed)

	eventually(t, 20*time.Second, "the commit back at 40 while the records read again are in flight", func() bool {
		return committed(t, brokers, group, topic, 1)[0] == 40
	})
	close(release)
	eventually(t, 20*time.Second, "the records written after the truncation published", func() bool {
		return countIDs(sk.Published())["after-4"] == 1
	})
	eventually(t, 10*time.Second, "committed to the log end", func() bool { return committed(t, brokers, group, topic, 1)[0] == 55 })
	n := countIDs(sk.Published())
	for i, id := range callIDs("old", 50) {
		want := 1
		if i >= 40 {
			want = 2
		}
		if n[id] != want {
			t.Errorf("%s published %d times, want %d (offsets 40 to 49 were read again after the truncation)", id, n[id], want)
		}
	}
	if s := c.Stats(); s.OffsetResets < 1 {
		t.Errorf("offset resets %d, want at least 1", s.OffsetResets)
	}
}

// truncatedAt50 is a cluster with 50 records (old-0 to old-49) in topic's
// one partition whose leader answers the first fetch at 50
// OFFSET_OUT_OF_RANGE, once armed is closed, and lists its log end at 40
// until franz-go fetched at 40 again, as after an unclean leader election
// that lost offsets 40 to 49; reread reports that fetch at 40. The log
// itself keeps its records, which stand in for the new ones written at 40
// to 49.
func truncatedAt50(t *testing.T, topic string) (cluster *kfake.Cluster, brokers []string, armed chan struct{}, reread *atomic.Bool) {
	cluster, brokers = newCluster(t, topic, 1)
	produce(t, brokers, topic, msgsFor(0, callIDs("old", 50)))
	id := cluster.TopicInfo(topic).TopicID
	ours := func(rt string, rid [16]byte) bool { return rt == topic || rid == id }

	// truncated: the fetch at 50 was answered OFFSET_OUT_OF_RANGE (held
	// until armed, once 50 is committed: a fetch session names the
	// partition only when its offset changes, so the answer must be to
	// the first fetch at 50).
	var truncated atomic.Bool
	reread = new(atomic.Bool)
	armed = make(chan struct{})
	cluster.ControlKey(kmsg.Fetch.Int16(), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		cluster.KeepControl()
		req := kreq.(*kmsg.FetchRequest)
		for _, rt := range req.Topics {
			for _, rp := range rt.Partitions {
				if !ours(rt.Topic, rt.TopicID) {
					continue
				}
				if truncated.Load() && rp.FetchOffset == 40 {
					reread.Store(true)
				}
				if rp.FetchOffset != 50 || truncated.Load() {
					continue
				}
				cluster.SleepControl(func() { <-armed })
				truncated.Store(true)
				resp := req.ResponseKind().(*kmsg.FetchResponse)
				st := kmsg.NewFetchResponseTopic()
				st.Topic, st.TopicID = topic, id
				sp := kmsg.NewFetchResponseTopicPartition()
				sp.ErrorCode = kerr.OffsetOutOfRange.Code
				sp.HighWatermark, sp.LastStableOffset, sp.LogStartOffset = 40, 40, 0
				st.Partitions = append(st.Partitions, sp)
				resp.Topics = append(resp.Topics, st)
				return resp, nil, true
			}
		}
		return nil, nil, false
	})
	// The log end, and the record a minute before the last one read
	// (franz-go's default reset), are both 40 until the fetch at 40.
	listedAt40(cluster, topic, func() bool { return truncated.Load() && !reread.Load() })
	return cluster, brokers, armed, reread
}

// listedAt40 makes the cluster list topic's log end, and the record a
// minute before the last one read (franz-go's default reset), at 40 while
// cut is true: a log cut back to 40 (the log start stays 0).
func listedAt40(cluster *kfake.Cluster, topic string, cut func() bool) {
	cluster.ControlKey(kmsg.ListOffsets.Int16(), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		cluster.KeepControl()
		req := kreq.(*kmsg.ListOffsetsRequest)
		if !cut() || len(req.Topics) != 1 || req.Topics[0].Topic != topic {
			return nil, nil, false
		}
		resp := req.ResponseKind().(*kmsg.ListOffsetsResponse)
		st := kmsg.NewListOffsetsResponseTopic()
		st.Topic = topic
		for _, rp := range req.Topics[0].Partitions {
			sp := kmsg.NewListOffsetsResponseTopicPartition()
			sp.Partition, sp.LeaderEpoch, sp.Timestamp = rp.Partition, -1, -1
			sp.Offset = 40
			if rp.Timestamp == -2 {
				sp.Offset = 0
			}
			st.Partitions = append(st.Partitions, sp)
		}
		resp.Topics = append(resp.Topics, st)
		return resp, nil, true
	})
}

// holdReread is a fakeScorer whose call with old-40, once it is read again
// after the truncation (see truncatedAt50), waits for release.
func holdReread(reread *atomic.Bool, release <-chan struct{}) *fakeScorer {
	return &fakeScorer{hook: func(ctx context.Context, events []schema.TranscriptEvent) error {
		if !reread.Load() || !slices.ContainsFunc(events, func(e schema.TranscriptEvent) bool { return e.CallID == "old-40" }) {
			return nil
		}
		select {
		case <-release:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}}
}

// TestRewindCommitInFlight: the commit that writes 50 is in flight at the
// broker when the log is truncated to 40 and read again from there, and
// answers only after the fetcher handed the records at 40 to 49 over; no
// record arrives after them, so the fetcher waits for the next. The
// committed offset must still go back to 40 while those records are in
// flight: left at 50, a crash or a rebalance would resume past them.
func TestRewindCommitInFlight(t *testing.T) {
	t.Parallel()
	const topic, group = "rewind-inflight", "g-rewind-inflight"
	cluster, brokers, armed, reread := truncatedAt50(t, topic)
	// The first commit of 50 is held until the records read again were
	// handed over. after counts the commits sent after it: commits run
	// one at a time, so one sent says it was answered.
	var held atomic.Bool
	var after atomic.Int32
	inFlight, answer := make(chan struct{}), make(chan struct{})
	cluster.ControlKey(kmsg.OffsetCommit.Int16(), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		cluster.KeepControl()
		req := kreq.(*kmsg.OffsetCommitRequest)
		if req.Group == group && held.Load() {
			after.Add(1)
		}
		for _, rt := range req.Topics {
			for _, rp := range rt.Partitions {
				if req.Group == group && rt.Topic == topic && rp.Offset == 50 && held.CompareAndSwap(false, true) {
					close(inFlight)
					cluster.SleepControl(func() { <-answer })
				}
			}
		}
		return nil, nil, false
	})
	release := make(chan struct{})
	sk := &fakeSink{}
	c, _ := startMetered(t, testConfig(brokers, topic, group), holdReread(reread, release), sk)
	select {
	case <-inFlight:
	case <-time.After(20 * time.Second):
		t.Fatal("no commit of 50")
	}
	close(armed)
	eventually(t, 20*time.Second, "the records at 40 to 49 handed over again", func() bool {
		g := c.cur.Load()
		return g != nil && g.parts[0].wm.Tracked() == 60
	})
	// The fetcher looks at the commit once more after the poll that
	// delivered them; the commit in flight must answer after that.
	time.Sleep(200 * time.Millisecond)
	close(answer)
	// Not read back: the commit of 40 may follow it at once.
	eventually(t, 20*time.Second, "the commit of 50 answered", func() bool { return after.Load() > 0 })

	eventually(t, 5*time.Second, "the commit back at 40 while the records read again are in flight", func() bool {
		return committed(t, brokers, group, topic, 1)[0] == 40
	})
	close(release)
	eventually(t, 10*time.Second, "committed to the log end again", func() bool { return committed(t, brokers, group, topic, 1)[0] == 50 })
	if n := countIDs(sk.Published())["old-49"]; n != 2 {
		t.Errorf("old-49 published %d times, want 2 (read again after the truncation)", n)
	}
}

// TestTopicRecreatedRead: 50 records were scored and committed, then the
// input topic is deleted and created again under its name with the same
// partition count (so no rebalance), and 20 records are written to it. The
// scorer must read the new topic from its start and publish them; before,
// its fetcher retried the old topic's ID forever with readiness and
// liveness green.
func TestTopicRecreatedRead(t *testing.T) {
	t.Parallel()
	const topic, group = "recreated", "g-recreated"
	cluster, brokers := newCluster(t, topic, 1)
	produce(t, brokers, topic, msgsFor(0, callIDs("old", 50)))
	sk := &fakeSink{}
	c, _ := startMetered(t, testConfig(brokers, topic, group), &fakeScorer{}, sk)
	eventually(t, 20*time.Second, "the first 50 committed", func() bool { return committed(t, brokers, group, topic, 1)[0] == 50 })

	if err := cluster.DeleteTopic(topic); err != nil {
		t.Fatal(err)
	}
	if err := cluster.CreateTopic(topic, 1, nil); err != nil {
		t.Fatal(err)
	}
	produce(t, brokers, topic, msgsFor(0, callIDs("new", 20)))

	eventually(t, 20*time.Second, "the re-created topic's records published", func() bool {
		return countIDs(sk.Published())["new-19"] == 1
	})
	eventually(t, 10*time.Second, "committed to the new log's end", func() bool { return committed(t, brokers, group, topic, 1)[0] == 20 })
	n := countIDs(sk.Published())
	for _, id := range callIDs("new", 20) {
		if n[id] != 1 {
			t.Errorf("%s published %d times, want 1", id, n[id])
		}
	}
	if s := c.Stats(); s.OffsetResets < 1 || s.Generations != 1 {
		t.Errorf("offset resets %d (want at least 1), generations %d (want 1: the partition count did not change)", s.OffsetResets, s.Generations)
	}
}
