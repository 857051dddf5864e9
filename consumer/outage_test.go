package consumer

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/scorer/scorer/schema"
)

// TestScorerOutageNotDeadLettered: the scorer fails every call for well
// over the batch and per-event retries (a lost GPU, a closed pool). Nothing
// goes to the DLQ; once it recovers every event is scored and committed.
func TestScorerOutageNotDeadLettered(t *testing.T) {
	t.Parallel()
	const topic, group, n = "outage", "g-outage", 6
	_, brokers := newCluster(t, topic, 1)
	var msgs []kafka.Message
	for i := range n {
		msgs = append(msgs, eventMsg(0, fmt.Sprintf("o-%d", i)))
	}
	produce(t, brokers, topic, msgs)
	var firstCall atomic.Int64
	sc := &fakeScorer{hook: func(context.Context, []schema.TranscriptEvent) error {
		firstCall.CompareAndSwap(0, time.Now().UnixNano())
		if time.Since(time.Unix(0, firstCall.Load())) < 1500*time.Millisecond {
			return errors.New("gpupool: pool closed")
		}
		return nil
	}}
	sk := &fakeSink{}
	cfg := testConfig(brokers, topic, group)
	cfg.OutageBackoffMax = 200 * time.Millisecond
	start(t, cfg, sc, sk, testHooks{})
	eventually(t, 20*time.Second, "committed to end", func() bool { return committed(t, brokers, group, topic, 1)[0] == n })
	if d := sk.Dead(); len(d) != 0 {
		t.Fatalf("outage dead-lettered %d events: %+v", len(d), d[0])
	}
	for id, c := range countIDs(sk.Published()) {
		if c != 1 {
			t.Errorf("%s published %d times", id, c)
		}
	}
	if len(sk.Published()) != n {
		t.Errorf("published %d, want %d", len(sk.Published()), n)
	}
}

// TestLonePoisonDeadLetteredWhenScorerHealthy: an event that always fails,
// alone in its batch, is dead-lettered once the scorer is seen to score
// other events; its neighbours are published.
func TestLonePoisonDeadLetteredWhenScorerHealthy(t *testing.T) {
	t.Parallel()
	const topic, group = "lonepoison", "g-lonepoison"
	_, brokers := newCluster(t, topic, 1)
	produce(t, brokers, topic, []kafka.Message{eventMsg(0, "good-0"), eventMsg(0, "poison"), eventMsg(0, "good-2")})
	sc := &fakeScorer{hook: func(_ context.Context, evs []schema.TranscriptEvent) error {
		for _, e := range evs {
			if e.CallID == "poison" {
				return errors.New("model exploded")
			}
		}
		return nil
	}}
	sk := &fakeSink{}
	cfg := testConfig(brokers, topic, group)
	cfg.BatchMaxMessages = 1
	cfg.OutageBackoffMax = 100 * time.Millisecond
	start(t, cfg, sc, sk, testHooks{})
	eventually(t, 20*time.Second, "committed to end", func() bool { return committed(t, brokers, group, topic, 1)[0] == 3 })
	dead := sk.Dead()
	if len(dead) != 1 || dead[0].Offset != 1 || dead[0].Reason != ReasonScoreFailed {
		t.Fatalf("dead = %+v", dead)
	}
	if got := countIDs(sk.Published()); got["good-0"] != 1 || got["good-2"] != 1 || got["poison"] != 0 {
		t.Errorf("published %v", got)
	}
}

// invalidInput is a scorer error that says the input itself is bad.
type invalidInput struct{}

func (invalidInput) Error() string   { return "invalid input" }
func (invalidInput) Permanent() bool { return true }

// TestPermanentScoreErrorDeadLetteredAtOnce: an error marked permanent is
// not retried: the event is scored once alone and dead-lettered.
func TestPermanentScoreErrorDeadLetteredAtOnce(t *testing.T) {
	t.Parallel()
	const topic, group = "permscore", "g-permscore"
	_, brokers := newCluster(t, topic, 1)
	produce(t, brokers, topic, []kafka.Message{eventMsg(0, "bad")})
	sc := &fakeScorer{hook: func(context.Context, []schema.TranscriptEvent) error {
		return fmt.Errorf("model: tokenizing: %w", invalidInput{})
	}}
	sk := &fakeSink{}
	start(t, testConfig(brokers, topic, group), sc, sk, testHooks{})
	eventually(t, 20*time.Second, "committed to end", func() bool { return committed(t, brokers, group, topic, 1)[0] == 1 })
	if d := sk.Dead(); len(d) != 1 || d[0].Reason != ReasonScoreFailed {
		t.Fatalf("dead = %+v", d)
	}
	if n := len(sc.Calls()); n != 1 {
		t.Errorf("scorer called %d times for a permanent error, want 1", n)
	}
}

// TestScorerPanicDeadLettersTheEvent: a scorer that panics on one event
// (a bug that input trips) must not crash the process — a crash would
// loop on the uncommitted record forever. The event is dead-lettered
// with the panic in its message; its neighbours, in the same batch, are
// published.
func TestScorerPanicDeadLettersTheEvent(t *testing.T) {
	t.Parallel()
	const topic, group = "panics", "g-panics"
	_, brokers := newCluster(t, topic, 1)
	produce(t, brokers, topic, []kafka.Message{eventMsg(0, "good-0"), eventMsg(0, "boom"), eventMsg(0, "good-2")})
	sc := &fakeScorer{hook: func(_ context.Context, evs []schema.TranscriptEvent) error {
		for _, e := range evs {
			if e.CallID == "boom" {
				panic("index out of range in a scorer bug")
			}
		}
		return nil
	}}
	sk := &fakeSink{}
	cfg := testConfig(brokers, topic, group)
	cfg.OutageBackoffMax = 100 * time.Millisecond
	start(t, cfg, sc, sk, testHooks{})
	eventually(t, 20*time.Second, "committed to end", func() bool { return committed(t, brokers, group, topic, 1)[0] == 3 })
	dead := sk.Dead()
	if len(dead) != 1 || dead[0].Offset != 1 || dead[0].Reason != ReasonScoreFailed ||
		!strings.Contains(dead[0].Message, "panic") || !strings.Contains(dead[0].Message, "scorer bug") {
		t.Fatalf("dead = %+v, want offset 1 as score_failed naming the panic", dead)
	}
	if got := countIDs(sk.Published()); got["good-0"] != 1 || got["good-2"] != 1 || got["boom"] != 0 {
		t.Errorf("published %v", got)
	}
}

// TestReadinessIgnoresOnePartitionsFetchErrors: every fetch of partition 1
// fails (TOPIC_AUTHORIZATION_FAILED) while partition 0 is read. Readiness
// says whether the member is in the group and its commits work; it does not
// flip with one partition's fetches, which show in scorer_fetch_errors_total
// and the log instead.
func TestReadinessIgnoresOnePartitionsFetchErrors(t *testing.T) {
	t.Parallel()
	const topic, group = "fetchfail", "g-fetchfail"
	c, brokers := newCluster(t, topic, 2)
	c.ControlKey(kmsg.Fetch.Int16(), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		req := kreq.(*kmsg.FetchRequest)
		for _, rt := range req.Topics {
			for _, rp := range rt.Partitions {
				if rp.Partition != 1 {
					continue
				}
				resp := req.ResponseKind().(*kmsg.FetchResponse)
				t := kmsg.NewFetchResponseTopic()
				t.Topic, t.TopicID = rt.Topic, rt.TopicID
				p := kmsg.NewFetchResponseTopicPartition()
				p.Partition, p.ErrorCode = 1, kerr.TopicAuthorizationFailed.Code
				t.Partitions = append(t.Partitions, p)
				resp.Topics = append(resp.Topics, t)
				return resp, nil, true
			}
		}
		return nil, nil, false
	})
	produce(t, brokers, topic, []kafka.Message{eventMsg(0, "p0")})
	sk := &fakeSink{}
	cons, reg := startMetered(t, testConfig(brokers, topic, group), &fakeScorer{}, sk)
	eventually(t, 20*time.Second, "p0 published", func() bool { return countIDs(sk.Published())["p0"] == 1 })
	eventually(t, 10*time.Second, "partition 1's fetches failing", func() bool {
		v, _ := gaugeOf(t, reg, "scorer_fetch_errors_total", 1)
		return v >= 2
	})
	for end := time.Now().Add(2 * time.Second); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
		if !cons.Ready() {
			t.Fatal("not ready while the member consumes and commits, because one partition's fetches fail")
		}
	}
}
