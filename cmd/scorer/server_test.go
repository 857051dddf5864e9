package main

import (
	"context"
	"net/http"
	"sync/atomic"
	"testing"

	"github.com/rs/zerolog"
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
		if got := metricValue(scrape(t, addr), "scorer_ready"); got != step.want {
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
