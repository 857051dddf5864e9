package producer

import (
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"testing"
	"time"
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
