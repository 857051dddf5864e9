package producer

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/kversion"

	"github.com/scorer/scorer/internal/kafkatest"
)

// silentBroker accepts TCP connections and never answers, like a broker
// that is wedged or a port that is not Kafka. It returns its address.
func silentBroker(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, _ = io.Copy(io.Discard, c) // read requests, answer nothing
			}()
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		mu.Lock()
		for _, c := range conns {
			_ = c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return ln.Addr().String()
}

// ensureWithin runs f and fails the test if it has not returned within d
// (the call is left running: it is the bug being tested for).
func ensureWithin(t *testing.T, d time.Duration, f func() error) error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- f() }()
	select {
	case err := <-done:
		return err
	case <-time.After(d):
		t.Fatalf("EnsureTopics still blocked %v after it should have returned", d)
		return nil
	}
}

func TestEnsureTopicsSilentBrokerCancel(t *testing.T) {
	t.Parallel()
	addr := silentBroker(t)
	ctx, cancel := context.WithCancel(t.Context())
	time.AfterFunc(200*time.Millisecond, cancel)
	start := time.Now()
	err := ensureWithin(t, 5*time.Second, func() error {
		return EnsureTopics(ctx, []string{addr}, nil, TopicSpec{Name: "t"})
	})
	if !errors.Is(err, context.Canceled) {
		t.Errorf("EnsureTopics = %v, want context.Canceled", err)
	}
	t.Logf("returned %v after start", time.Since(start))
}

func TestEnsureTopicsSilentBrokerDeadline(t *testing.T) {
	t.Parallel()
	addr := silentBroker(t)
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	err := ensureWithin(t, 5*time.Second, func() error {
		return EnsureTopics(ctx, []string{addr}, nil, TopicSpec{Name: "t"})
	})
	if err == nil {
		t.Fatal("EnsureTopics = nil against a silent broker")
	}
}

// TestEnsureTopicsAttemptTimeout: with no deadline and no cancel on ctx, the
// per-attempt timeout still ends the call.
func TestEnsureTopicsAttemptTimeout(t *testing.T) {
	t.Parallel()
	addr := silentBroker(t)
	err := ensureWithin(t, 5*time.Second, func() error {
		_, err := prepareTopics(context.Background(), 200*time.Millisecond, []string{addr}, nil, true, TopicSpec{Name: "t"})
		return err
	})
	if err == nil {
		t.Fatal("prepareTopics = nil against a silent broker")
	}
}

// TestEnsureTopicsWithoutCreatePermission: a cluster whose ACLs refuse
// CreateTopics (TOPIC_AUTHORIZATION_FAILED, even for topics that exist, as
// Kafka checks CREATE before existence). When every topic exists
// EnsureTopics must not ask to create anything and succeed; when one is
// missing it fails naming the refusal.
func TestEnsureTopicsWithoutCreatePermission(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	var creates atomic.Int32
	answerCreates(c, kerr.TopicAuthorizationFailed.Code, &creates)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	existing := []TopicSpec{{Name: topicOut, Partitions: 3}, {Name: topicDLQ, Partitions: 1}}
	if err := EnsureTopics(ctx, c.ListenAddrs(), nil, existing...); err != nil {
		t.Fatalf("all topics exist: %v", err)
	}
	if n := creates.Load(); n != 0 {
		t.Errorf("sent %d CreateTopics requests for topics that exist", n)
	}
	err := EnsureTopics(ctx, c.ListenAddrs(), nil, append(existing, TopicSpec{Name: "missing.topic"})...)
	if err == nil || !strings.Contains(strings.ToLower(err.Error()), "authoriz") {
		t.Fatalf("missing topic without CREATE permission: err = %v, want the authorization failure", err)
	}
	if n := creates.Load(); n != 1 {
		t.Errorf("sent %d CreateTopics requests, want 1 (for the missing topic only)", n)
	}
}

// answerCreates makes c answer every CreateTopics request with code for
// each topic, counting the requests in count (when not nil).
func answerCreates(c *kfake.Cluster, code int16, count *atomic.Int32) {
	c.ControlKey(kmsg.CreateTopics.Int16(), func(req kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		if count != nil {
			count.Add(1)
		}
		creq := req.(*kmsg.CreateTopicsRequest)
		resp := creq.ResponseKind().(*kmsg.CreateTopicsResponse)
		for _, rt := range creq.Topics {
			st := kmsg.NewCreateTopicsResponseTopic()
			st.Topic, st.ErrorCode = rt.Topic, code
			resp.Topics = append(resp.Topics, st)
		}
		return resp, nil, true
	})
}

// deadAddr is an address nothing listens on: a dial is refused at once.
func deadAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	return addr
}

// TestPrepareTopicsTriesEveryBootstrapBroker: a bootstrap list whose first
// brokers are down (refused, or accepting and never answering) still
// reaches the cluster through a later one, within one attempt.
func TestPrepareTopicsTriesEveryBootstrapBroker(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	brokers := append([]string{deadAddr(t), silentBroker(t)}, c.ListenAddrs()...)
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	// Each broker gets a share of the attempt: the silent one 3 s of 6.
	limits, err := prepareTopics(ctx, 6*time.Second, brokers, nil, true, TopicSpec{Name: "fresh.topic", Partitions: 2}, TopicSpec{Name: topicOut})
	if err != nil {
		t.Fatalf("bootstrap list with dead and silent brokers first: %v", err)
	}
	if limits["fresh.topic"] <= 0 || limits[topicOut] <= 0 {
		t.Errorf("max.message.bytes = %v, want both topics' limits", limits)
	}
}

// TestPrepareTopicsPermanentErrors: what the cluster will refuse again is a
// *SetupError (Permanent) naming the cause, so start-up stops at once
// instead of retrying forever; what may heal is not.
func TestPrepareTopicsPermanentErrors(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	isPermanent := func(err error) bool {
		var p interface{ Permanent() bool }
		return errors.As(err, &p) && p.Permanent()
	}
	c := newCluster(t)
	err := EnsureTopics(ctx, c.ListenAddrs(), nil, TopicSpec{Name: "three.replicas", ReplicationFactor: 3})
	if !isPermanent(err) || !errors.Is(err, kafka.InvalidReplicationFactor) || !strings.Contains(err.Error(), "three.replicas") {
		t.Errorf("replication factor 3 on one broker: err = %v, want a permanent InvalidReplicationFactor naming the topic", err)
	}
	_, err = PrepareTopics(ctx, c.ListenAddrs(), nil, false, TopicSpec{Name: topicOut}, TopicSpec{Name: "not.there"})
	if !isPermanent(err) || !strings.Contains(err.Error(), "not.there") || strings.Contains(err.Error(), topicOut+",") {
		t.Errorf("missing topic with creation off: err = %v, want a permanent error naming not.there only", err)
	}

	denied := newCluster(t)
	answerCreates(denied, kerr.TopicAuthorizationFailed.Code, nil)
	if err := EnsureTopics(ctx, denied.ListenAddrs(), nil, TopicSpec{Name: "missing.topic"}); !isPermanent(err) || !errors.Is(err, kafka.TopicAuthorizationFailed) {
		t.Errorf("create without permission: err = %v, want a permanent TopicAuthorizationFailed", err)
	}

	// A leader election in progress heals: not permanent.
	electing := newCluster(t)
	answerCreates(electing, kerr.LeaderNotAvailable.Code, nil)
	if err := EnsureTopics(ctx, electing.ListenAddrs(), nil, TopicSpec{Name: "later.topic"}); err == nil || isPermanent(err) {
		t.Errorf("leader not available: err = %v, want a retriable error", err)
	}
	// No broker reachable at all heals too (the cluster may be starting).
	if err := EnsureTopics(ctx, []string{deadAddr(t), deadAddr(t)}, nil, TopicSpec{Name: "t"}); err == nil || isPermanent(err) {
		t.Errorf("no broker reachable: err = %v, want a retriable error", err)
	}
}

// TestPrepareTopicsReportsMaxMessageBytes: a topic created with
// max.message.bytes reports it; one that exists keeps and reports its own
// (nothing is altered), and one without its own reports the default the
// cluster gives it.
func TestPrepareTopicsReportsMaxMessageBytes(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	limits, err := PrepareTopics(ctx, c.ListenAddrs(), nil, true,
		TopicSpec{Name: "big.topic", Configs: map[string]string{"max.message.bytes": "70000000"}}, TopicSpec{Name: topicOut})
	if err != nil {
		t.Fatal(err)
	}
	// kfake reports Kafka's default for a topic without its own setting.
	if limits["big.topic"] != 70_000_000 || limits[topicOut] != 1_048_588 {
		t.Errorf("max.message.bytes = %v, want big.topic 70000000 (its own) and %s 1048588 (the default)", limits, topicOut)
	}
	limits, err = PrepareTopics(ctx, c.ListenAddrs(), nil, true, TopicSpec{Name: "big.topic", Configs: map[string]string{"max.message.bytes": "5000000"}})
	if err != nil {
		t.Fatal(err)
	}
	if limits["big.topic"] != 70_000_000 {
		t.Errorf("existing big.topic: max.message.bytes = %d, want its own 70000000 (left alone)", limits["big.topic"])
	}
}

// TestCreatedTopicTakesBrokerDefaultReplication: a topic created without a
// replication factor gets the cluster's default (CreateTopics asks with
// -1), not one replica: on a cluster with min.insync.replicas=2 a topic of
// one replica refuses every acks=all write. kfake answers -1 with
// min(3, brokers) replicas (it has no default.replication.factor of its
// own), so three brokers show it. An explicit factor is kept.
func TestCreatedTopicTakesBrokerDefaultReplication(t *testing.T) {
	t.Parallel()
	c := newCluster(t, kfake.NumBrokers(3))
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	if err := EnsureTopics(ctx, c.ListenAddrs(), nil, TopicSpec{Name: "default.rf", Partitions: 2},
		TopicSpec{Name: "two.rf", Partitions: 2, ReplicationFactor: 2}); err != nil {
		t.Fatal(err)
	}
	for topic, want := range map[string]int{"default.rf": 3, "two.rf": 2} {
		got := kafkatest.Replicas(t, c.ListenAddrs(), topic)
		if len(got) != 2 {
			t.Errorf("%s: %d partitions, want 2", topic, len(got))
		}
		for p, n := range got {
			if n != want {
				t.Errorf("%s partition %d: %d replicas, want %d", topic, p, n, want)
			}
		}
	}
}

// TestBrokerDefaultReplicationOnOldBroker: a controller that answers
// CreateTopics below v4 (Kafka 2.3) cannot take -1 for its default; the
// topic is not created and the error says why, permanently (retrying will
// not upgrade the cluster). An explicit factor still works there.
func TestBrokerDefaultReplicationOnOldBroker(t *testing.T) {
	t.Parallel()
	c := newCluster(t, kfake.MaxVersions(kversion.V2_3_0()))
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	err := EnsureTopics(ctx, c.ListenAddrs(), nil, TopicSpec{Name: "default.rf"})
	var se *SetupError
	if !errors.Is(err, ErrBrokerDefaultUnsupported) || !errors.As(err, &se) || !strings.Contains(err.Error(), "default.rf") {
		t.Fatalf("broker default on a Kafka 2.3 controller: err = %v, want a *SetupError wrapping ErrBrokerDefaultUnsupported naming default.rf", err)
	}
	if got := kafkatest.Replicas(t, c.ListenAddrs(), "default.rf"); len(got) != 0 {
		t.Errorf("default.rf created with %v replicas after the refusal", got)
	}
	if err := EnsureTopics(ctx, c.ListenAddrs(), nil, TopicSpec{Name: "one.rf", ReplicationFactor: 1}); err != nil {
		t.Errorf("explicit replication factor on a Kafka 2.3 controller: %v", err)
	}
	if got := kafkatest.Replicas(t, c.ListenAddrs(), "one.rf"); len(got) != 1 || got[0] != 1 {
		t.Errorf("one.rf replicas %v, want [1]", got)
	}
}
