package service

import (
	"context"
	"net/http"
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
// flight and nothing moved for longer than the limit; progress, an idle
// pipeline and a shutdown keep it 200.
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
		oldest   time.Duration
	)
	h.progress.Store(&progressWatch{limit: time.Minute,
		now:    func() time.Time { mu.Lock(); defer mu.Unlock(); return now },
		sample: func() (uint64, bool) { mu.Lock(); defer mu.Unlock(); return progress, pending },
		oldest: func() time.Duration { mu.Lock(); defer mu.Unlock(); return oldest }})
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
		{"moving, one record unacknowledged within the limit", time.Second, 5, true, 200},
		{"moving, one record unacknowledged past the limit", time.Second, 5, true, 503},
		{"that record acknowledged", time.Second, 5, true, 200},
	} {
		set(step.advance, step.moved, step.pending)
		mu.Lock()
		switch step.name {
		case "moving, one record unacknowledged within the limit":
			oldest = 59 * time.Second
		case "moving, one record unacknowledged past the limit":
			oldest = 61 * time.Second
		default:
			oldest = 0
		}
		mu.Unlock()
		if got := httpStatus(t, "http://"+addr+"/healthz"); got != step.want {
			t.Errorf("%s: /healthz = %d, want %d", step.name, got, step.want)
		}
	}
	h.shuttingDown.Store(true)
	if got := httpStatus(t, "http://"+addr+"/healthz"); got != 200 {
		t.Errorf("while draining: /healthz = %d, want 200 (the drain is bounded by SHUTDOWN_TIMEOUT)", got)
	}
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
