package consumer

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// TestTruncatedIdleLogCommitsResetPoint: 50 records were scored and
// committed, then an unclean leader election cuts the partition's log back
// to 40 while nobody writes to it. franz-go reports the data loss and
// reads on from 40, where there is nothing yet. The commit must go back to
// 40 at once, with no record arriving to trigger it: left at 50, the
// partition's next owner (after a rebalance or a restart) would read from
// 50 and never score the records written at 40 to 49 after the election,
// or, with fewer than ten of them, find 50 past the log end and replay the
// whole retained log. The second half is that next owner: a member that
// starts once the log holds records at 40 to 49 again (the old records
// stand in for the new ones) must score them.
func TestTruncatedIdleLogCommitsResetPoint(t *testing.T) {
	t.Parallel()
	const topic, group = "truncated-idle", "g-truncated-idle"
	_, brokers, armed, grown := truncatedIdleAt50(t, topic)
	sk := &fakeSink{}
	first := start(t, testConfig(brokers, topic, group), &fakeScorer{}, sk, testHooks{})
	eventually(t, 20*time.Second, "the first 50 committed", func() bool { return committed(t, brokers, group, topic, 1)[0] == 50 })
	close(armed)

	eventually(t, 20*time.Second, "the data loss reported as an offset reset", func() bool { return first.c.Stats().OffsetResets >= 1 })
	eventually(t, 10*time.Second, "the commit back at 40 with nothing written after the truncation", func() bool {
		return committed(t, brokers, group, topic, 1)[0] == 40
	})
	first.stop(t)

	close(grown)
	second := start(t, testConfig(brokers, topic, group), &fakeScorer{}, sk, testHooks{})
	eventually(t, 20*time.Second, "the records at 40 to 49 scored by the next owner", func() bool {
		return countIDs(sk.Published())["old-49"] == 2
	})
	eventually(t, 10*time.Second, "committed to the log end", func() bool { return committed(t, brokers, group, topic, 1)[0] == 50 })
	n := countIDs(sk.Published())
	for i, id := range callIDs("old", 50) {
		want := 1
		if i >= 40 {
			want = 2
		}
		if n[id] != want {
			t.Errorf("%s published %d times, want %d (offsets 40 to 49 were written again after the truncation)", id, n[id], want)
		}
	}
	if s := second.c.Stats(); s.OffsetResets != 0 {
		t.Errorf("the next owner reset its offset %d times, want 0 (40 lies inside the log)", s.OffsetResets)
	}
}

// truncatedIdleAt50 is a cluster with 50 records (old-0 to old-49) in
// topic's one partition whose leader, once armed is closed, answers the
// fetch at 50 OFFSET_OUT_OF_RANGE and lists its log end at 40, and answers
// every fetch at 40 with no records and a high watermark of 40: a log an
// unclean leader election cut back to 40, with nothing written since. Once
// grown is closed the leader answers from its log again, which still holds
// the old records at 40 to 49: they stand in for new ones written there.
func truncatedIdleAt50(t *testing.T, topic string) (cluster *kfake.Cluster, brokers []string, armed, grown chan struct{}) {
	cluster, brokers = newCluster(t, topic, 1)
	produce(t, brokers, topic, msgsFor(0, callIDs("old", 50)))
	id := cluster.TopicInfo(topic).TopicID
	ours := func(rt string, rid [16]byte) bool { return rt == topic || rid == id }
	isGrown := func() bool {
		select {
		case <-grown:
			return true
		default:
			return false
		}
	}

	// truncated: the fetch at 50 was answered OFFSET_OUT_OF_RANGE (held
	// until armed, once 50 is committed: a fetch session names the
	// partition only when its offset changes, so the answer must be to
	// the first fetch at 50). That answer carries no fetch session, so
	// franz-go fetches without one from then on and every later fetch
	// names the partition.
	var truncated atomic.Bool
	armed, grown = make(chan struct{}), make(chan struct{})
	cluster.ControlKey(kmsg.Fetch.Int16(), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		cluster.KeepControl()
		req := kreq.(*kmsg.FetchRequest)
		if isGrown() {
			return nil, nil, false
		}
		for _, rt := range req.Topics {
			for _, rp := range rt.Partitions {
				if !ours(rt.Topic, rt.TopicID) {
					continue
				}
				sp := kmsg.NewFetchResponseTopicPartition()
				sp.Partition = rp.Partition
				sp.HighWatermark, sp.LastStableOffset, sp.LogStartOffset = 40, 40, 0
				switch {
				case rp.FetchOffset == 50 && !truncated.Load():
					cluster.SleepControl(func() { <-armed })
					truncated.Store(true)
					sp.ErrorCode = kerr.OffsetOutOfRange.Code
				case rp.FetchOffset == 40 && truncated.Load():
					// Nothing there yet: answered after the fetch's
					// wait, as a broker answers, not in a busy loop.
					cluster.SleepControl(func() {
						select {
						case <-grown:
						case <-time.After(time.Duration(req.MaxWaitMillis) * time.Millisecond):
						}
					})
				default:
					continue
				}
				resp := req.ResponseKind().(*kmsg.FetchResponse)
				st := kmsg.NewFetchResponseTopic()
				st.Topic, st.TopicID = topic, id
				st.Partitions = append(st.Partitions, sp)
				resp.Topics = append(resp.Topics, st)
				return resp, nil, true
			}
		}
		return nil, nil, false
	})
	// The log end, and the record a minute before the last one read
	// (franz-go's default reset), are both 40 until the log has grown.
	listedAt40(cluster, topic, func() bool { return truncated.Load() && !isGrown() })
	return cluster, brokers, armed, grown
}

// TestRewoundToCommittedOffsetResumes: a member committed 20 of the input
// topic's 20 records, then the topic is deleted and re-created under its
// name (same partition count, so no rebalance) and 20 records are written
// to it. The consumer reads the new topic from its start; its 20 records
// resolve to 20, exactly the offset already committed, so there is nothing
// new to commit, and with MAX_UNCOMMITTED at 20 they must still not count
// as uncommitted: a crash resumes at 20 and does not replay them. Counted
// so, they held the partition paused for good with nothing in flight and
// no commit to free it, and the 21st record was never read.
func TestRewoundToCommittedOffsetResumes(t *testing.T) {
	t.Parallel()
	const topic, group = "rewound-committed", "g-rewound-committed"
	cluster, brokers := newCluster(t, topic, 1)
	produce(t, brokers, topic, msgsFor(0, callIDs("old", 20)))
	commitOffset(t, brokers, group, topic, 20)
	// fetching: the consumer's fetcher fetched at 20, so it knows the old
	// topic's ID and sees the new one as re-created.
	fetching := make(chan struct{})
	var seen atomic.Bool
	cluster.ControlKey(kmsg.Fetch.Int16(), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		cluster.KeepControl()
		for _, rt := range kreq.(*kmsg.FetchRequest).Topics {
			for _, rp := range rt.Partitions {
				if rp.FetchOffset == 20 && seen.CompareAndSwap(false, true) {
					close(fetching)
				}
			}
		}
		return nil, nil, false
	})
	cfg := testConfig(brokers, topic, group)
	// No periodic commit: only a pause's request, or nothing, commits.
	cfg.MaxUncommitted, cfg.CommitInterval = 20, time.Hour
	sk := &fakeSink{}
	c, _ := startMetered(t, cfg, &fakeScorer{}, sk)
	select {
	case <-fetching:
	case <-time.After(20 * time.Second):
		t.Fatal("no fetch at the committed offset 20")
	}

	if err := cluster.DeleteTopic(topic); err != nil {
		t.Fatal(err)
	}
	if err := cluster.CreateTopic(topic, 1, nil); err != nil {
		t.Fatal(err)
	}
	produce(t, brokers, topic, msgsFor(0, callIDs("new", 20)))
	eventually(t, 20*time.Second, "the re-created topic's 20 records published", func() bool {
		return countIDs(sk.Published())["new-19"] == 1
	})
	produce(t, brokers, topic, msgsFor(0, []string{"new-20"}))
	eventually(t, 10*time.Second, "the 21st record published", func() bool {
		return countIDs(sk.Published())["new-20"] == 1
	})
	if s := c.Stats(); s.OffsetResets < 1 || s.Generations != 1 {
		t.Errorf("offset resets %d (want at least 1), generations %d (want 1)", s.OffsetResets, s.Generations)
	}
}

// TestPausedPartitionCommitAskedDuringCommit: with MAX_UNCOMMITTED at 4 and
// no periodic commit, partition 0 pauses on its fifth record and asks for
// a commit, which the coordinator holds. Meanwhile partition 1 pauses on
// its fifth record and asks too, while that commit, which read partition
// 1's watermark before its records were acknowledged, still runs. Once it
// answers, partition 1's request must still be served: dropped, it left
// partition 1 paused with nothing in flight until the next periodic
// commit (here an hour).
func TestPausedPartitionCommitAskedDuringCommit(t *testing.T) {
	t.Parallel()
	const topic, group = "asked-during-commit", "g-asked-during-commit"
	cluster, brokers := newCluster(t, topic, 2)
	var held atomic.Bool
	inFlight, answer := make(chan struct{}), make(chan struct{})
	cluster.ControlKey(kmsg.OffsetCommit.Int16(), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		cluster.KeepControl()
		if kreq.(*kmsg.OffsetCommitRequest).Group == group && held.CompareAndSwap(false, true) {
			close(inFlight)
			cluster.SleepControl(func() { <-answer })
		}
		return nil, nil, false
	})
	cfg := testConfig(brokers, topic, group)
	cfg.MaxUncommitted, cfg.CommitInterval = 4, time.Hour
	sk := &fakeSink{}
	c, _ := startMetered(t, cfg, &fakeScorer{}, sk)
	produce(t, brokers, topic, msgsFor(0, callIDs("a", 5)))
	select {
	case <-inFlight:
	case <-time.After(20 * time.Second):
		t.Fatal("partition 0 asked for no commit")
	}

	produce(t, brokers, topic, msgsFor(1, callIDs("b", 5)))
	eventually(t, 20*time.Second, "partition 1's first four records acknowledged", func() bool {
		g := c.cur.Load()
		if g == nil {
			return false
		}
		next, ok := g.parts[1].wm.Committable()
		return ok && next == 4
	})
	// Its paused fetcher asks within a poll of that (spanPoll); the commit
	// in flight must answer after the ask.
	time.Sleep(200 * time.Millisecond)
	close(answer)
	eventually(t, 10*time.Second, "partition 0's fifth record published", func() bool { return countIDs(sk.Published())["a-4"] == 1 })
	eventually(t, 10*time.Second, "partition 1's fifth record published", func() bool { return countIDs(sk.Published())["b-4"] == 1 })
}
