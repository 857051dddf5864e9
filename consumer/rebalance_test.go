package consumer

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/scorer/scorer/schema"
)

// groupLog is an ordered log of the assignments members received (from the
// consumer's hook) and the offset commits the broker received (from a kfake
// control function), to check who committed what in which generation.
type groupLog struct {
	mu     sync.Mutex
	events []groupEvent
}

type groupEvent struct {
	commit     bool
	member     string
	generation int32
	partitions []int
}

func (l *groupLog) add(e groupEvent) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.events = append(l.events, e)
}

// check verifies that every commit names only partitions its member was
// assigned in that generation, and that it came before the member's next
// assignment (so nothing is committed after a revocation).
func (l *groupLog) check(t *testing.T) (commits int) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	current := map[string]groupEvent{}
	for _, e := range l.events {
		if !e.commit {
			current[e.member] = e
			continue
		}
		commits++
		a, ok := current[e.member]
		if !ok {
			t.Errorf("member %s committed %v in generation %d before any assignment", e.member, e.partitions, e.generation)
			continue
		}
		if a.generation != e.generation {
			t.Errorf("member %s committed %v for generation %d while in generation %d", e.member, e.partitions, e.generation, a.generation)
		}
		for _, p := range e.partitions {
			if !slices.Contains(a.partitions, p) {
				t.Errorf("member %s committed partition %d in generation %d; assigned %v", e.member, p, e.generation, a.partitions)
			}
		}
	}
	return commits
}

// TestRebalanceNoLossNoStaleCommits: a second member joins mid-stream; no
// record is lost, offsets reach the end, and no member commits a partition
// outside its current assignment.
func TestRebalanceNoLossNoStaleCommits(t *testing.T) {
	t.Parallel()
	const topic, group, parts, total = "rebal", "g-rebal", 4, 240
	cluster, brokers := newCluster(t, topic, parts)
	log := &groupLog{}
	cluster.ControlKey(int16(kmsg.OffsetCommit), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		req := kreq.(*kmsg.OffsetCommitRequest)
		if req.Group == group {
			var ps []int
			for _, tp := range req.Topics {
				for _, p := range tp.Partitions {
					ps = append(ps, int(p.Partition))
				}
			}
			log.add(groupEvent{commit: true, member: req.MemberID, generation: req.Generation, partitions: ps})
		}
		return nil, nil, false // observe only; the broker handles it
	})
	hooks := testHooks{assigned: func(gen int32, member string, ps []int) {
		log.add(groupEvent{member: member, generation: gen, partitions: slices.Clone(ps)})
	}}

	// Produce in the background, spread over a few seconds.
	produced := make(chan error, 1)
	tr := testTransport(t)
	go func() {
		w := &kafka.Writer{Addr: kafka.TCP(brokers...), Topic: topic, RequiredAcks: kafka.RequireAll,
			BatchTimeout: time.Millisecond, Transport: tr,
			Balancer: kafka.BalancerFunc(func(m kafka.Message, _ ...int) int { return m.Partition })}
		defer w.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		for i := 0; i < total; i += 8 {
			var batch []kafka.Message
			for j := i; j < i+8; j++ {
				batch = append(batch, eventMsg(j%parts, fmt.Sprintf("rb-%d", j)))
			}
			if err := w.WriteMessages(ctx, batch...); err != nil {
				produced <- err
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
		produced <- nil
	}()

	skA, skB := &fakeSink{}, &fakeSink{}
	a := start(t, testConfig(brokers, topic, group), &fakeScorer{}, skA, hooks)
	eventually(t, 20*time.Second, "A processing", func() bool { return len(skA.Published()) >= 40 })
	b := start(t, testConfig(brokers, topic, group), &fakeScorer{}, skB, hooks)
	eventually(t, 30*time.Second, "B assigned", func() bool { return b.c.Stats().Assigned > 0 })
	select {
	case err := <-produced:
		if err != nil {
			t.Fatalf("produce: %v", err)
		}
	case <-time.After(40 * time.Second):
		t.Fatal("producer stuck")
	}
	eventually(t, 30*time.Second, "committed to end", func() bool {
		c := committed(t, brokers, group, topic, parts)
		for p := range parts {
			if c[p] != total/parts {
				return false
			}
		}
		return true
	})
	all := countIDs(append(skA.Published(), skB.Published()...))
	for i := range total {
		if all[fmt.Sprintf("rb-%d", i)] == 0 {
			t.Errorf("rb-%d lost", i)
		}
	}
	if len(skB.Published()) == 0 {
		t.Error("B published nothing")
	}
	if sa := a.c.Stats(); sa.Generations < 2 || sa.Assigned >= parts {
		t.Errorf("A stats after rebalance = %+v", sa)
	}
	a.stop(t)
	b.stop(t)
	if n := log.check(t); n == 0 {
		t.Error("no commits observed")
	}
}

// staleScorer blocks its first call containing "stuck" until release is
// closed, ignoring ctx (as a scorer in the middle of a GPU call may), and
// marks that call's results ScoredAt "stale"; every other call is normal.
type staleScorer struct {
	fakeScorer
	entered, release chan struct{}
	once             sync.Once
}

func (s *staleScorer) Score(ctx context.Context, events []schema.TranscriptEvent) ([]schema.ScoredTranscript, error) {
	stale := false
	for _, e := range events {
		if e.CallID == "stuck" {
			s.once.Do(func() {
				stale = true
				close(s.entered)
				<-s.release
			})
		}
	}
	out, err := s.fakeScorer.Score(ctx, events)
	for i := range out {
		if stale {
			out[i].ScoredAt = "stale"
		}
	}
	return out, err
}

// TestRevokedWorkNotPublished: a batch still being scored when its
// generation is revoked (after RevokeTimeout) is not published by this
// member when the scorer finally returns: the partition's new owner
// publishes it.
func TestRevokedWorkNotPublished(t *testing.T) {
	t.Parallel()
	const topic, group = "revoked", "g-revoked"
	_, brokers := newCluster(t, topic, 2)
	produce(t, brokers, topic, []kafka.Message{eventMsg(0, "stuck"), eventMsg(1, "other")})
	sc := &staleScorer{entered: make(chan struct{}), release: make(chan struct{})}
	released := false
	defer func() {
		if !released {
			close(sc.release)
		}
	}()
	skA, skB := &fakeSink{}, &fakeSink{}
	cfg := testConfig(brokers, topic, group)
	cfg.BatchMaxMessages = 1
	cfg.RevokeTimeout = time.Second
	a := start(t, cfg, sc, skA, testHooks{})
	select {
	case <-sc.entered:
	case <-time.After(20 * time.Second):
		t.Fatal("stuck event never reached the scorer")
	}
	start(t, testConfig(brokers, topic, group), &fakeScorer{}, skB, testHooks{})
	eventually(t, 30*time.Second, "A's generation revoked and a new one started", func() bool { return a.c.Stats().Generations >= 2 })
	close(sc.release)
	released = true
	eventually(t, 30*time.Second, "stuck published by its owner", func() bool {
		return countIDs(append(skA.Published(), skB.Published()...))["stuck"] > 0
	})
	time.Sleep(300 * time.Millisecond) // give a late publish every chance
	for _, res := range append(skA.Published(), skB.Published()...) {
		if res.ScoredAt == "stale" {
			t.Fatalf("result of the revoked generation published: %+v", res)
		}
	}
}

// TestEndedGenerationNotFetched: a generation that ends before its work
// starts (a second member joined meanwhile) fetches nothing. kafka-go runs
// the function of an ended generation without waiting for it and rejoins,
// so anything fetched then is scored and published beside the partitions'
// next owners.
func TestEndedGenerationNotFetched(t *testing.T) {
	t.Parallel()
	const topic, group, parts = "ended", "g-ended", 2
	_, brokers := newCluster(t, topic, parts)
	msgs := spreadMsgs(parts, callIDs("e", 20))
	produce(t, brokers, topic, msgs)
	cfg := testConfig(brokers, topic, group)
	secondAssigned := make(chan struct{})
	var once sync.Once
	sk1, sk2 := &fakeSink{}, &fakeSink{}
	first := make(chan int32, 1)
	start(t, cfg, &fakeScorer{}, sk1, testHooks{starting: func(gen int32) {
		select {
		case first <- gen:
			// Hold the first generation until the second member is in a
			// generation of its own: this one has ended by then.
			select {
			case <-secondAssigned:
			case <-time.After(20 * time.Second):
			}
		default:
		}
	}})
	var gen1 int32
	select {
	case gen1 = <-first:
	case <-time.After(20 * time.Second):
		t.Fatal("no first generation")
	}
	start(t, cfg, &fakeScorer{}, sk2, testHooks{assigned: func(int32, string, []int) { once.Do(func() { close(secondAssigned) }) }})
	eventually(t, 30*time.Second, "every record published", func() bool {
		return len(countIDs(append(sk1.Published(), sk2.Published()...))) == len(msgs)
	})
	time.Sleep(time.Second)
	for _, res := range append(sk1.Published(), sk2.Published()...) {
		if res.Source.Generation == gen1 {
			t.Errorf("%s published from generation %d, which had ended before it started", res.CallID, gen1)
		}
	}
}

// TestShutdownDuringRebalanceDrain: a member drains its ended generation at
// a rebalance, waiting for a record still being scored, when it is told to
// stop (a rolling update stopping the pod whose neighbour's exit caused the
// rebalance). It stops within ShutdownTimeout, publishes nothing of the
// ended generation after its end, and leaves the group without joining the
// next generation: no JoinGroup from it after the stop signal, a
// LeaveGroup, and the survivor needs one generation, not two (one with the
// dying member in it, one after it left). The record is published by the
// partition's owner.
func TestShutdownDuringRebalanceDrain(t *testing.T) {
	t.Parallel()
	shutdownDuringRebalanceDrain(t, "drainstop", 1)
}

// TestShutdownDuringRebalanceDrainThreeBrokers is the same with three
// brokers, all of them in the bootstrap list, as in production: kafka-go
// tries the next bootstrap broker when a dial fails, so refusing only the
// first dial of the rejoin did not stop it.
func TestShutdownDuringRebalanceDrainThreeBrokers(t *testing.T) {
	t.Parallel()
	shutdownDuringRebalanceDrain(t, "drainstop3", 3)
}

// newClusterOf is newCluster with numBrokers brokers; the addresses returned
// are all of them, the bootstrap list a consumer gets.
func newClusterOf(t *testing.T, topic string, partitions int32, numBrokers int) (*kfake.Cluster, []string) {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(numBrokers), kfake.SeedTopics(partitions, topic))
	if err != nil {
		t.Fatalf("kfake: %v", err)
	}
	t.Cleanup(c.Close)
	if got := len(c.ListenAddrs()); got != numBrokers {
		t.Fatalf("kfake listens on %d addresses, want %d", got, numBrokers)
	}
	return c, c.ListenAddrs()
}

// watchGroup counts, from the broker's side, the group's JoinGroup
// requests sent once stopping is set, and its LeaveGroup requests, from any
// member.
func watchGroup(cluster *kfake.Cluster, group string, stopping *atomic.Bool) (joinsAfter, leaves *atomic.Int32) {
	joinsAfter, leaves = new(atomic.Int32), new(atomic.Int32)
	cluster.ControlKey(int16(kmsg.JoinGroup), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		if kreq.(*kmsg.JoinGroupRequest).Group == group && stopping.Load() {
			joinsAfter.Add(1)
		}
		return nil, nil, false // observe only
	})
	cluster.ControlKey(int16(kmsg.LeaveGroup), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		if kreq.(*kmsg.LeaveGroupRequest).Group == group {
			leaves.Add(1)
		}
		return nil, nil, false
	})
	return joinsAfter, leaves
}

// watchMember counts, from the broker's side, the JoinGroup requests of
// the member *member sent once stopping is set, and its LeaveGroup
// requests (by either version's member field).
func watchMember(cluster *kfake.Cluster, group string, member *atomic.Pointer[string], stopping *atomic.Bool) (joinsAfter, leaves *atomic.Int32) {
	joinsAfter, leaves = new(atomic.Int32), new(atomic.Int32)
	is := func(id string) bool { m := member.Load(); return m != nil && id == *m }
	cluster.ControlKey(int16(kmsg.JoinGroup), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		if req := kreq.(*kmsg.JoinGroupRequest); req.Group == group && stopping.Load() && is(req.MemberID) {
			joinsAfter.Add(1)
		}
		return nil, nil, false // observe only
	})
	cluster.ControlKey(int16(kmsg.LeaveGroup), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		req := kreq.(*kmsg.LeaveGroupRequest)
		if req.Group != group {
			return nil, nil, false
		}
		if is(req.MemberID) {
			leaves.Add(1)
		}
		for _, m := range req.Members {
			if is(m.MemberID) {
				leaves.Add(1)
			}
		}
		return nil, nil, false
	})
	return joinsAfter, leaves
}

func shutdownDuringRebalanceDrain(t *testing.T, topic string, numBrokers int) {
	group := "g-" + topic
	cluster, brokers := newClusterOf(t, topic, 2, numBrokers)
	var memberA atomic.Pointer[string]
	var stopping atomic.Bool
	joinsAfter, leaves := watchMember(cluster, group, &memberA, &stopping)
	produce(t, brokers, topic, []kafka.Message{eventMsg(0, "stuck"), eventMsg(1, "other")})
	sc := &staleScorer{entered: make(chan struct{}), release: make(chan struct{})}
	defer close(sc.release)
	skA, skB := &fakeSink{}, &fakeSink{}
	cfg := testConfig(brokers, topic, group)
	cfg.BatchMaxMessages, cfg.RevokeTimeout, cfg.ShutdownTimeout = 1, 5*time.Second, 2*time.Second
	var draining atomic.Bool
	a := start(t, cfg, sc, skA, testHooks{
		assigned: func(_ int32, member string, _ []int) { memberA.Store(&member) },
		draining: func(_ int32, why string) { draining.Store(why == "rebalance") },
	})
	select {
	case <-sc.entered:
	case <-time.After(20 * time.Second):
		t.Fatal("stuck event never reached the scorer")
	}
	b := start(t, testConfig(brokers, topic, group), &fakeScorer{}, skB, testHooks{})
	// A's generation ends at B's join; A drains, waiting for "stuck".
	eventually(t, 20*time.Second, "A draining its ended generation", draining.Load)
	stopping.Store(true)
	t0 := time.Now()
	a.stop(t)
	if d := time.Since(t0); d > cfg.ShutdownTimeout+1500*time.Millisecond {
		t.Errorf("Run returned %v after the stop signal, ShutdownTimeout %v", d, cfg.ShutdownTimeout)
	}
	eventually(t, 30*time.Second, "stuck published by the remaining member", func() bool { return countIDs(skB.Published())["stuck"] > 0 })
	for _, res := range skA.Published() {
		if res.ScoredAt == "stale" {
			t.Errorf("A published %s from its ended generation: %+v", res.CallID, res.Source)
		}
	}
	if n := joinsAfter.Load(); n != 0 {
		t.Errorf("%d JoinGroup requests from the stopped member after the stop signal, want 0", n)
	}
	if leaves.Load() == 0 {
		t.Error("no LeaveGroup from the stopped member")
	}
	if n := b.c.Stats().Generations; n != 1 {
		t.Errorf("the remaining member went through %d generations, want 1", n)
	}
}

// TestShutdownDuringRebalanceCommitBounded: the coordinator does not answer
// a member's commits when a rebalance ends its generation, and the member
// is told to stop while its commit at the rebalance waits. The rebalance's
// commit budget (about 9.6 s here) is far longer than ShutdownTimeout
// (2 s): the probe and the final commit must end by the shutdown deadline,
// not the budget's, and the member still leaves without joining the next
// generation, with three bootstrap brokers (see
// TestShutdownDuringRebalanceDrainThreeBrokers).
func TestShutdownDuringRebalanceCommitBounded(t *testing.T) {
	t.Parallel()
	const topic, group = "drainhang", "g-drainhang"
	cluster, brokers := newClusterOf(t, topic, 2, 3)
	var memberA atomic.Pointer[string]
	var stopping atomic.Bool
	joinsAfter, leaves := watchMember(cluster, group, &memberA, &stopping)
	var hang atomic.Bool
	hanging, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	cluster.ControlKey(int16(kmsg.OffsetCommit), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		req := kreq.(*kmsg.OffsetCommitRequest)
		if a := memberA.Load(); req.Group == group && hang.Load() && a != nil && req.MemberID == *a {
			once.Do(func() { close(hanging) })
			cluster.SleepControl(func() { <-release })
		}
		return nil, nil, false
	})
	t.Cleanup(func() { close(release) })
	produce(t, brokers, topic, []kafka.Message{eventMsg(0, "stuck"), eventMsg(1, "other")})
	sc := &staleScorer{entered: make(chan struct{}), release: make(chan struct{})}
	defer close(sc.release)
	cfg := testConfig(brokers, topic, group)
	cfg.BatchMaxMessages, cfg.RevokeTimeout, cfg.ShutdownTimeout = 1, time.Second, 2*time.Second
	cfg.SessionTimeout, cfg.RebalanceTimeout = 30*time.Second, 30*time.Second
	if b := cfg.WithDefaults().rebalanceCommitBudget(); b < 4*cfg.ShutdownTimeout {
		t.Fatalf("commit budget %v: the test needs it well past ShutdownTimeout %v", b, cfg.ShutdownTimeout)
	}
	a := start(t, cfg, sc, &fakeSink{}, testHooks{assigned: func(_ int32, member string, _ []int) { memberA.Store(&member) }})
	select {
	case <-sc.entered:
	case <-time.After(20 * time.Second):
		t.Fatal("stuck event never reached the scorer")
	}
	// Nothing moves after this, so A's next commit is the probe its
	// generation's end sends.
	eventually(t, 20*time.Second, "other committed", func() bool { return committed(t, brokers, group, topic, 2)[1] == 1 })
	hang.Store(true)
	skB := &fakeSink{}
	start(t, testConfig(brokers, topic, group), &fakeScorer{}, skB, testHooks{})
	select {
	case <-hanging:
	case <-time.After(20 * time.Second):
		t.Fatal("A's commit at the rebalance never came")
	}
	stopping.Store(true)
	t0 := time.Now()
	a.stop(t)
	if d := time.Since(t0); d > cfg.ShutdownTimeout+1500*time.Millisecond {
		t.Errorf("Run returned %v after the stop signal, ShutdownTimeout %v", d, cfg.ShutdownTimeout)
	}
	eventually(t, 30*time.Second, "stuck published by the remaining member", func() bool { return countIDs(skB.Published())["stuck"] > 0 })
	if n := joinsAfter.Load(); n != 0 {
		t.Errorf("%d JoinGroup requests from the stopped member after the stop signal, want 0", n)
	}
	if leaves.Load() == 0 {
		t.Error("no LeaveGroup from the stopped member")
	}
}
