package service

import (
	"context"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/scorer/scorer/internal/testenv"
)

// TestReadyGaugeAtScrape: scorer_ready follows the readiness checks at
// every scrape of /metrics, with /readyz never called.
func TestReadyGaugeAtScrape(t *testing.T) {
	reg := newRegistry()
	h := newHealth(reg)
	addr, stop, err := startHTTP("127.0.0.1:0", reg, h, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = stop(context.Background()) })

	var assigned atomic.Bool
	ready := assigned.Load
	for _, step := range []struct {
		name string
		do   func()
		want float64
	}{
		{"nothing started", func() {}, 0},
		{"model loaded, no consumer", func() { h.modelLoaded.Store(true) }, 0},
		{"consumer without partitions", func() { h.consumerReady.Store(&ready) }, 0},
		{"group joined", func() { assigned.Store(true) }, 1},
		{"partitions revoked", func() { assigned.Store(false) }, 0},
		{"assigned again", func() { assigned.Store(true) }, 1},
		{"shutting down", func() { h.shuttingDown.Store(true) }, 0},
	} {
		step.do()
		if got := testenv.MetricValue(testenv.Scrape(t, addr), "scorer_ready"); got != step.want {
			t.Errorf("%s: scorer_ready = %v, want %v", step.name, got, step.want)
		}
	}
	resp, err := http.Get("http://" + addr + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("/readyz = %d while shutting down, want 503", resp.StatusCode)
	}
}

// TestHealthzFailsWhenStalled: /healthz turns 503 only when records are in
// flight and nothing moved for longer than the limit, or one inference run
// or one record's publish or dead letter went on for longer; progress, an
// idle pipeline and a shutdown keep it 200.
func TestHealthzFailsWhenStalled(t *testing.T) {
	reg := newRegistry()
	h := newHealth(reg)
	addr, stop, err := startHTTP("127.0.0.1:0", reg, h, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = stop(context.Background()) })
	var (
		mu       sync.Mutex
		now      = time.Unix(1_700_000_000, 0)
		progress uint64
		pending  bool
		run, ack time.Duration
	)
	h.progress.Store(&progressWatch{limit: time.Minute,
		now:    func() time.Time { mu.Lock(); defer mu.Unlock(); return now },
		sample: func() (uint64, bool) { mu.Lock(); defer mu.Unlock(); return progress, pending },
		stuck:  func() (time.Duration, string) { mu.Lock(); defer mu.Unlock(); return oldestStuck(run, ack) }})
	set := func(advance time.Duration, moved uint64, waiting bool) {
		mu.Lock()
		defer mu.Unlock()
		now, progress, pending = now.Add(advance), progress+moved, waiting
	}
	for _, step := range []struct {
		name    string
		advance time.Duration
		moved   uint64
		pending bool
		want    int
	}{
		{"first look, work waiting", 0, 0, true, 200},
		{"busy, progressing", 50 * time.Second, 3, true, 200},
		{"no progress within the limit", 50 * time.Second, 0, true, 200},
		{"no progress past the limit", 20 * time.Second, 0, true, 503},
		{"still stuck", time.Hour, 0, true, 503},
		{"a batch finished", time.Second, 1, true, 200},
		{"idle for long", 2 * time.Hour, 0, false, 200},
		{"work arrives after idling", time.Second, 0, true, 200},
		{"stuck again past the limit", 61 * time.Second, 0, true, 503},
		{"moving again", time.Second, 5, true, 200},
		{"moving, one record's dead letter retried within the limit", time.Second, 5, true, 200},
		{"moving, one record's dead letter retried past the limit", time.Second, 5, true, 503},
		{"that record acknowledged", time.Second, 5, true, 200},
		{"moving, one inference run past the limit", time.Second, 5, true, 503},
		{"that run returned", time.Second, 5, true, 200},
	} {
		set(step.advance, step.moved, step.pending)
		mu.Lock()
		run, ack = 0, 0
		switch step.name {
		case "moving, one record's dead letter retried within the limit":
			ack = 59 * time.Second
		case "moving, one record's dead letter retried past the limit":
			ack = 61 * time.Second
		case "moving, one inference run past the limit":
			run = 61 * time.Second
		}
		mu.Unlock()
		code, body := httpGet(t, "http://"+addr+"/healthz")
		if code != step.want {
			t.Errorf("%s: /healthz = %d, want %d", step.name, code, step.want)
		}
		if want := map[string]string{"moving, one record's dead letter retried past the limit": stuckRecord,
			"moving, one inference run past the limit": stuckRun}[step.name]; want != "" && !strings.Contains(body, want) {
			t.Errorf("%s: /healthz body %q does not name %q", step.name, body, want)
		}
	}
	h.shuttingDown.Store(true)
	if got := httpStatus(t, "http://"+addr+"/healthz"); got != 200 {
		t.Errorf("while draining: /healthz = %d, want 200 (the drain is bounded by SHUTDOWN_TIMEOUT)", got)
	}
}

func httpGet(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func httpStatus(t *testing.T, url string) int {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}
