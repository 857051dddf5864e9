package consumer

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/scorer/scorer/schema"
)

// TestCleanRun: every record is published exactly once with its Source,
// and the committed offsets reach the end of every partition.
func TestCleanRun(t *testing.T) {
	t.Parallel()
	const topic, group, parts, perPart = "clean", "g-clean", 3, 20
	_, brokers := newCluster(t, topic, parts)
	var msgs []kafka.Message
	for p := range parts {
		for i := range perPart {
			msgs = append(msgs, eventMsg(p, fmt.Sprintf("c-%d-%d", p, i)))
		}
	}
	produce(t, brokers, topic, msgs)
	sc, sk := &fakeScorer{}, &fakeSink{}
	r := start(t, testConfig(brokers, topic, group), sc, sk, testHooks{})
	eventually(t, 20*time.Second, "all published", func() bool { return len(sk.Published()) >= len(msgs) })
	eventually(t, 10*time.Second, "commits at end", func() bool {
		c := committed(t, brokers, group, topic, parts)
		return c[0] == perPart && c[1] == perPart && c[2] == perPart
	})
	if !r.c.Ready() {
		t.Error("not ready while consuming")
	}
	r.stop(t)
	res := sk.Published()
	if len(res) != len(msgs) {
		t.Fatalf("published %d, want %d", len(res), len(msgs))
	}
	for id, n := range countIDs(res) {
		if n != 1 {
			t.Errorf("%s published %d times", id, n)
		}
	}
	for _, st := range res {
		var p, i int
		fmt.Sscanf(st.CallID, "c-%d-%d", &p, &i)
		if st.Source == nil || st.Source.Topic != topic || st.Source.Partition != p || st.Source.Offset != int64(i) {
			t.Fatalf("%s: source = %+v", st.CallID, st.Source)
		}
	}
	for _, call := range sc.Calls() {
		if len(call) > 8 {
			t.Errorf("batch of %d > BatchMaxMessages 8", len(call))
		}
	}
	if s := r.c.Stats(); s.Inflight != 0 || s.MessagesIn != uint64(len(msgs)) || s.Published != uint64(len(msgs)) {
		t.Errorf("stats = %+v", s)
	}
	if r.c.Ready() {
		t.Error("ready after shutdown")
	}
}

// TestDeadLetters: bad records go to the DLQ with the Connect-style
// details, the good ones around them are scored, and all are committed.
func TestDeadLetters(t *testing.T) {
	t.Parallel()
	const topic, group = "dlq", "g-dlq"
	_, brokers := newCluster(t, topic, 1)
	msgs := []kafka.Message{
		eventMsg(0, "good-0"),
		{Key: []byte("k1"), Value: []byte(`{not json`), Headers: []kafka.Header{{Key: "h", Value: []byte("v")}}},
		eventMsg(0, "good-2"),
		{Key: []byte("k3"), Value: []byte(`{"sections":{"FILT_MD":["x"]}}`)},
		{Key: []byte("k4"), Value: []byte(strings.Repeat("x", 5000))},
		eventMsg(0, "poison"),
		eventMsg(0, "good-6"),
	}
	produce(t, brokers, topic, msgs)
	sc, sk := &fakeScorer{}, &fakeSink{}
	sc.hook = func(_ context.Context, evs []schema.TranscriptEvent) error {
		for _, e := range evs {
			if e.CallID == "poison" {
				return errors.New("model exploded")
			}
		}
		return nil
	}
	cfg := testConfig(brokers, topic, group)
	cfg.MaxMessageBytes = 4096
	start(t, cfg, sc, sk, testHooks{})
	eventually(t, 20*time.Second, "committed to end", func() bool { return committed(t, brokers, group, topic, 1)[0] == int64(len(msgs)) })

	got := countIDs(sk.Published())
	for _, id := range []string{"good-0", "good-2", "good-6"} {
		if got[id] != 1 {
			t.Errorf("%s published %d times", id, got[id])
		}
	}
	if got["poison"] != 0 {
		t.Error("poison published")
	}
	want := map[int64]struct{ stage, reason string }{
		1: {schema.StageDecode, "malformed_json"},
		3: {schema.StageDecode, "missing_field"},
		4: {schema.StageDecode, ReasonTooLarge},
		5: {schema.StageScore, ReasonScoreFailed},
	}
	dead := sk.Dead()
	if len(dead) != len(want) {
		t.Fatalf("dead letters = %+v", dead)
	}
	for _, d := range dead {
		w, ok := want[d.Offset]
		if !ok || d.Stage != w.stage || d.Reason != w.reason {
			t.Errorf("offset %d: stage %q reason %q, want %+v", d.Offset, d.Stage, d.Reason, w)
		}
		orig := msgs[d.Offset]
		if d.Topic != topic || d.Partition != 0 || string(d.Key) != string(orig.Key) || string(d.Value) != string(orig.Value) ||
			d.ExceptionClass == "" || d.Message == "" || d.Timestamp.IsZero() {
			t.Errorf("offset %d: dead letter %+v", d.Offset, d)
		}
		if d.Offset == 1 && (len(d.Headers) != 1 || d.Headers[0].Key != "h") {
			t.Errorf("headers not kept: %+v", d.Headers)
		}
	}
}

// TestPermanentPublishError: a result the sink can never write sends its
// input to the DLQ at the produce stage; its batch neighbours are published.
func TestPermanentPublishError(t *testing.T) {
	t.Parallel()
	const topic, group = "perm", "g-perm"
	_, brokers := newCluster(t, topic, 1)
	produce(t, brokers, topic, []kafka.Message{eventMsg(0, "a"), eventMsg(0, "huge"), eventMsg(0, "b")})
	sk := &fakeSink{publishErr: func(res []schema.ScoredTranscript) error {
		for _, r := range res {
			if r.CallID == "huge" {
				return &permanentSinkError{Err: kafka.MessageSizeTooLarge}
			}
		}
		return nil
	}}
	start(t, testConfig(brokers, topic, group), &fakeScorer{}, sk, testHooks{})
	eventually(t, 20*time.Second, "committed to end", func() bool { return committed(t, brokers, group, topic, 1)[0] == 3 })
	got := countIDs(sk.Published())
	if got["a"] != 1 || got["b"] != 1 || got["huge"] != 0 {
		t.Errorf("published %v", got)
	}
	dead := sk.Dead()
	if len(dead) != 1 || dead[0].Offset != 1 || dead[0].Stage != schema.StageProduce || dead[0].Reason != ReasonOutputTooLarge {
		t.Errorf("dead = %+v", dead)
	}
}

// TestOutOfOrderNeverCommitsPastGap: with one record held in the scorer,
// later records of its partition are scored but neither published nor
// committed before it (acknowledgement is in offset order), while the other
// partition publishes and commits to its end.
func TestOutOfOrderNeverCommitsPastGap(t *testing.T) {
	t.Parallel()
	const topic, group = "ooo", "g-ooo"
	_, brokers := newCluster(t, topic, 2)
	var msgs []kafka.Message
	for p := range 2 {
		for i := range 6 {
			msgs = append(msgs, eventMsg(p, fmt.Sprintf("c-%d-%d", p, i)))
		}
	}
	produce(t, brokers, topic, msgs)
	release := make(chan struct{})
	sc := blockOn("c-0-2", release)
	sk := &fakeSink{}
	cfg := testConfig(brokers, topic, group)
	cfg.BatchMaxMessages = 1 // one record per batch: completion order is free
	cfg.MaxInflightBatches = 4
	start(t, cfg, sc, sk, testHooks{})
	eventually(t, 10*time.Second, "partition 1 committed", func() bool { return committed(t, brokers, group, topic, 2)[1] == 6 })
	// Later records of partition 0 are scored meanwhile (inference
	// overlaps) but wait for the held one before they are published.
	eventually(t, 10*time.Second, "partition 0 scored past the held record", func() bool {
		for _, call := range sc.Calls() {
			if call[0] == "c-0-4" {
				return true
			}
		}
		return false
	})
	time.Sleep(5 * cfg.CommitInterval) // give a wrong commit or publish every chance to happen
	if c := committed(t, brokers, group, topic, 2); c[0] != 2 {
		t.Fatalf("partition 0 committed %d with offset 2 in flight, want 2", c[0])
	}
	if n := countIDs(sk.Published()); n["c-0-3"]+n["c-0-4"]+n["c-0-5"] != 0 || n["c-0-0"] != 1 || n["c-0-1"] != 1 {
		t.Fatalf("published %v: partition 0's records after the held one were published before it", n)
	}
	close(release)
	eventually(t, 10*time.Second, "partition 0 committed", func() bool { return committed(t, brokers, group, topic, 2)[0] == 6 })
	var order []string
	for _, r := range sk.Published() {
		if r.Source.Partition == 0 {
			order = append(order, r.CallID)
		}
	}
	if want := []string{"c-0-0", "c-0-1", "c-0-2", "c-0-3", "c-0-4", "c-0-5"}; !slices.Equal(order, want) {
		t.Fatalf("partition 0 published in order %v, want %v", order, want)
	}
}

// TestBatchBounds: no batch over BatchMaxMessages or BatchMaxBytes (unless
// one record alone), and a lone record waits BatchMaxWait from when it was
// added, not longer than needed.
func TestBatchBounds(t *testing.T) {
	t.Parallel()
	const topic, group = "bounds", "g-bounds"
	_, brokers := newCluster(t, topic, 1)
	sizes := map[string]int{}
	var msgs []kafka.Message
	for i := range 40 {
		id := fmt.Sprintf("b-%02d", i)
		pad := strings.Repeat("y", (i%7)*120)
		m := kafka.Message{Value: fmt.Appendf(nil, `{"call_id":%q,"sections":{"FILT_MD":[%q]}}`, id, pad)}
		if i == 13 {
			m.Value = fmt.Appendf(nil, `{"call_id":%q,"sections":{"FILT_MD":[%q]}}`, id, strings.Repeat("z", 3000))
		}
		sizes[id] = len(m.Value)
		msgs = append(msgs, m)
	}
	produce(t, brokers, topic, msgs)
	sc, sk := &fakeScorer{}, &fakeSink{}
	cfg := testConfig(brokers, topic, group)
	cfg.BatchMaxMessages, cfg.BatchMaxBytes, cfg.BatchMaxWait = 5, 2500, 300*time.Millisecond
	r := start(t, cfg, sc, sk, testHooks{})
	eventually(t, 20*time.Second, "all published", func() bool { return len(sk.Published()) == len(msgs) })
	for _, call := range sc.Calls() {
		total := 0
		for _, id := range call {
			total += sizes[id]
		}
		if len(call) > 5 || (total > 2500 && len(call) > 1) {
			t.Errorf("batch %v: %d records, %d bytes", call, len(call), total)
		}
	}
	if s := r.c.Stats(); s.Batches["bytes"] == 0 || s.Batches["count"] == 0 {
		t.Errorf("triggers = %v, want both bytes and count", s.Batches)
	}

	// MaxWait: a lone record is flushed by the period rule, after waiting.
	before := len(sc.Calls())
	t0 := time.Now()
	produce(t, brokers, topic, []kafka.Message{eventMsg(0, "lone")})
	eventually(t, 10*time.Second, "lone record scored", func() bool { return len(sc.Calls()) > before })
	if waited := time.Since(t0); waited < cfg.BatchMaxWait {
		t.Errorf("lone record scored after %v < BatchMaxWait", waited)
	}
	if s := r.c.Stats(); s.Batches["period"] == 0 {
		t.Errorf("triggers = %v, want period", s.Batches)
	}
}

// TestBackpressure: with the scorer blocked, fetched-but-unacknowledged
// records stay within the in-flight bound, and everything completes once
// it unblocks.
func TestBackpressure(t *testing.T) {
	t.Parallel()
	const topic, group, parts = "bp", "g-bp", 2
	_, brokers := newCluster(t, topic, parts)
	msgs := spreadMsgs(parts, callIDs("bp", 60))
	produce(t, brokers, topic, msgs)
	release := make(chan struct{})
	var blocked sync.WaitGroup
	blocked.Add(2)
	var once [2]sync.Once
	var n int
	var mu sync.Mutex
	sc := &fakeScorer{hook: func(ctx context.Context, _ []schema.TranscriptEvent) error {
		mu.Lock()
		if n < 2 {
			once[n].Do(blocked.Done)
		}
		n++
		mu.Unlock()
		select {
		case <-release:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}}
	sk := &fakeSink{}
	cfg := testConfig(brokers, topic, group)
	cfg.BatchMaxMessages, cfg.MaxInflightBatches, cfg.MaxUncommitted = 3, 2, 5
	r := start(t, cfg, sc, sk, testHooks{})
	waitDone := make(chan struct{})
	go func() { blocked.Wait(); close(waitDone) }()
	select {
	case <-waitDone:
	case <-time.After(20 * time.Second):
		t.Fatal("scorer never got two batches")
	}
	time.Sleep(time.Second) // let fetchers run into the wall
	// Batches in flight, plus one record held by each fetcher and one
	// held by the batch loop after an overflow.
	bound := int64(cfg.MaxInflightBatches*cfg.BatchMaxMessages + parts + 1)
	s := r.c.Stats()
	if s.InflightPeak > bound || s.Inflight > bound {
		t.Fatalf("in flight %d (peak %d) > bound %d", s.Inflight, s.InflightPeak, bound)
	}
	if s.MessagesIn > uint64(bound) {
		t.Fatalf("fetched %d while blocked, bound %d", s.MessagesIn, bound)
	}
	if len(sc.Calls()) != 2 {
		t.Fatalf("scorer calls while blocked = %d, want 2", len(sc.Calls()))
	}
	close(release)
	eventually(t, 20*time.Second, "all published", func() bool { return len(sk.Published()) == len(msgs) })
	// Running, scored records may also wait for their partition's turn to
	// publish off the workers: at most MaxUncommitted per partition.
	runBound := int64(parts * cfg.MaxUncommitted)
	if s := r.c.Stats(); s.InflightPeak > runBound {
		t.Fatalf("in-flight peak %d > bound %d", s.InflightPeak, runBound)
	}
}

// TestShutdownCommitsDoneWork: a shutdown with one record stuck in the
// scorer returns nil within ShutdownTimeout, commits everything before the
// stuck record, and a restarted consumer resumes there: duplicates only for
// records at or after the stuck one (done out of order, not committable).
func TestShutdownCommitsDoneWorkAndRestartResumes(t *testing.T) {
	t.Parallel()
	const topic, group = "restart", "g-restart"
	_, brokers := newCluster(t, topic, 1)
	var msgs []kafka.Message
	for i := range 10 {
		msgs = append(msgs, eventMsg(0, fmt.Sprintf("r-%d", i)))
	}
	produce(t, brokers, topic, msgs)
	sc1 := &fakeScorer{hook: func(ctx context.Context, evs []schema.TranscriptEvent) error {
		for _, e := range evs {
			if e.CallID == "r-6" {
				<-ctx.Done() // stuck until the shutdown grace period ends
				return ctx.Err()
			}
		}
		return nil
	}}
	sk1 := &fakeSink{}
	cfg := testConfig(brokers, topic, group)
	cfg.BatchMaxMessages = 1
	cfg.ShutdownTimeout = time.Second
	r1 := start(t, cfg, sc1, sk1, testHooks{})
	eventually(t, 20*time.Second, "r-0..r-5 published", func() bool { return len(sk1.Published()) >= 6 })
	t0 := time.Now()
	r1.stop(t)
	if d := time.Since(t0); d > cfg.ShutdownTimeout+8*time.Second {
		t.Errorf("shutdown took %v", d)
	}
	if c := committed(t, brokers, group, topic, 1)[0]; c != 6 {
		t.Fatalf("committed %d after shutdown, want 6 (the stuck offset)", c)
	}
	first := countIDs(sk1.Published())
	if first["r-6"] != 0 {
		t.Fatal("stuck record published")
	}

	var more []kafka.Message
	for i := 10; i < 15; i++ {
		more = append(more, eventMsg(0, fmt.Sprintf("r-%d", i)))
	}
	produce(t, brokers, topic, more)
	sk2 := &fakeSink{}
	start(t, testConfig(brokers, topic, group), &fakeScorer{}, sk2, testHooks{})
	eventually(t, 20*time.Second, "committed to end", func() bool { return committed(t, brokers, group, topic, 1)[0] == 15 })
	second := countIDs(sk2.Published())
	for i := range 15 {
		id := fmt.Sprintf("r-%d", i)
		if first[id]+second[id] < 1 {
			t.Errorf("%s lost", id)
		}
		if i < 6 && second[id] > 0 {
			t.Errorf("%s republished although the first run committed it", id)
		}
		if second[id] > 1 {
			t.Errorf("%s published %d times by the second run", id, second[id])
		}
	}
}

// TestConfigDerivedTimeouts: RevokeTimeout and HeartbeatInterval follow
// short rebalance and session timeouts instead of failing validation
// through a setting the operator never chose; an explicit RevokeTimeout
// the session cannot outlive is rejected; the shutdown drain leaves a
// reserve and is capped by the session.
func TestConfigDerivedTimeouts(t *testing.T) {
	t.Parallel()
	base := Config{Brokers: []string{"x:9092"}}
	for _, tc := range []struct {
		name                      string
		session, rebalance        time.Duration
		wantHeartbeat, wantRevoke time.Duration
	}{
		{"defaults", 0, 0, 3 * time.Second, 10 * time.Second},
		{"short rebalance", 0, 8 * time.Second, 3 * time.Second, 2500 * time.Millisecond},
		{"rebalance 10s", 0, 10 * time.Second, 3 * time.Second, 3500 * time.Millisecond},
		{"short session", 6 * time.Second, 0, 2 * time.Second, 2 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := base
			cfg.SessionTimeout, cfg.RebalanceTimeout = tc.session, tc.rebalance
			cfg = cfg.WithDefaults()
			if err := cfg.Validate(); err != nil {
				t.Fatal(err)
			}
			if cfg.HeartbeatInterval != tc.wantHeartbeat || cfg.RevokeTimeout != tc.wantRevoke {
				t.Errorf("heartbeat %v revoke %v, want %v %v", cfg.HeartbeatInterval, cfg.RevokeTimeout, tc.wantHeartbeat, tc.wantRevoke)
			}
		})
	}
	bad := base
	bad.SessionTimeout, bad.HeartbeatInterval, bad.RevokeTimeout = 6*time.Second, time.Second, 5*time.Second
	if err := bad.WithDefaults().Validate(); err == nil || !strings.Contains(err.Error(), "SessionTimeout") {
		t.Errorf("RevokeTimeout = SessionTimeout − HeartbeatInterval: err = %v", err)
	}
	// Shorter than RebalanceTimeout alone is not enough: the member hears of
	// the rebalance up to one heartbeat late.
	late := base
	late.RebalanceTimeout, late.HeartbeatInterval, late.RevokeTimeout = 10*time.Second, 3*time.Second, 8*time.Second
	if err := late.WithDefaults().Validate(); err == nil || !strings.Contains(err.Error(), "RebalanceTimeout") {
		t.Errorf("RevokeTimeout + HeartbeatInterval > RebalanceTimeout: err = %v", err)
	}

	drain, clamped := base.WithDefaults().shutdownBudget()
	if drain != 27*time.Second || clamped {
		t.Errorf("default drain %v clamped %v, want 27s false", drain, clamped)
	}
	long := base
	long.ShutdownTimeout, long.SessionTimeout = 60*time.Second, 10*time.Second
	if drain, clamped := long.WithDefaults().shutdownBudget(); drain != 7*time.Second || !clamped {
		t.Errorf("60s shutdown with 10s session: drain %v clamped %v, want 7s true", drain, clamped)
	}
}

// TestIdleMemberIsReady: with more members than partitions one member gets
// nothing. It must still report ready: during a rolling update's surge the
// idle member may be the new pod, and a never-ready new pod stalls the
// rollout for good. Its idleness shows in Stats (and the assigned gauge).
func TestIdleMemberIsReady(t *testing.T) {
	t.Parallel()
	const topic, group = "idle", "g-idle"
	_, brokers := newCluster(t, topic, 1)
	cfg := testConfig(brokers, topic, group)
	a := start(t, cfg, &fakeScorer{}, &fakeSink{}, testHooks{})
	eventually(t, 20*time.Second, "first member ready", a.c.Ready)
	b := start(t, cfg, &fakeScorer{}, &fakeSink{}, testHooks{})
	eventually(t, 30*time.Second, "both members ready, one partition between them", func() bool {
		return a.c.Ready() && b.c.Ready() && a.c.Stats().Assigned+b.c.Stats().Assigned == 1
	})
	b.stop(t)
	if b.c.Ready() {
		t.Error("stopped member still ready")
	}
}
