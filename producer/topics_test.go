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

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
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
		return ensureTopics(context.Background(), 200*time.Millisecond, []string{addr}, nil, TopicSpec{Name: "t"})
	})
	if err == nil {
		t.Fatal("ensureTopics = nil against a silent broker")
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
	c.ControlKey(kmsg.CreateTopics.Int16(), func(req kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		creates.Add(1)
		creq := req.(*kmsg.CreateTopicsRequest)
		resp := creq.ResponseKind().(*kmsg.CreateTopicsResponse)
		for _, rt := range creq.Topics {
			st := kmsg.NewCreateTopicsResponseTopic()
			st.Topic = rt.Topic
			st.ErrorCode = kerr.TopicAuthorizationFailed.Code
			resp.Topics = append(resp.Topics, st)
		}
		return resp, nil, true
	})
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
