package main

import (
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/scorer/scorer/internal/broker"
	"github.com/scorer/scorer/internal/testenv"
)

// TestHealthzFailsWhenModelFileChanges: a running scorer whose model.onnx
// is written in place (same size, same inode, as `cp` over it or a sync
// sidecar does) turns /healthz 503 naming the file, so the orchestrator
// restarts it onto the model as it is now; a touch (same bytes, new
// modification time) fails nothing. Its CPU sessions read their weights
// from the mapped file, so until the restart they may score with other
// weights under the old version (issue 44, item 3).
func TestHealthzFailsWhenModelFileChanges(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the service with the real model")
	}
	src := testenv.ScorerModelDir(t)
	dir := t.TempDir()
	entries, err := os.ReadDir(src)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		from, to := filepath.Join(src, e.Name()), filepath.Join(dir, e.Name())
		if e.Name() == "model.onnx" {
			b, err := os.ReadFile(from)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(to, b, 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if err := os.Symlink(from, to); err != nil {
			t.Fatal(err)
		}
	}
	graph := filepath.Join(dir, "model.onnx")

	cluster, addr, err := broker.Start(broker.Options{Addr: "127.0.0.1:0", Partitions: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Close)
	metricsAddr := freeAddr(t)
	env := withEnv(testenv.ScorerEnv(t), "MODEL_DIR", dir, "KAFKA_BROKERS", addr, "METRICS_ADDR", metricsAddr,
		"KAFKA_INPUT_PARTITIONS", "1", "WORKERS", "1", "CPU_THREADS", "1", "CPU_CALIBRATION_CACHE", "off")
	stop := runInProcess(t, env)
	waitReady(t, metricsAddr, 90*time.Second)

	healthz := func() (int, string) {
		resp, err := http.Get("http://" + metricsAddr + "/healthz")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, strings.TrimSpace(string(body))
	}

	// Touched: the same bytes, so two check periods pass with /healthz 200.
	later := time.Now().Add(time.Minute)
	if err := os.Chtimes(graph, later, later); err != nil {
		t.Fatal(err)
	}
	for end := time.Now().Add(11 * time.Second); time.Now().Before(end); time.Sleep(500 * time.Millisecond) {
		if code, body := healthz(); code != http.StatusOK {
			t.Fatalf("/healthz = %d %q after model.onnx was only touched, want 200", code, body)
		}
	}

	testenv.FlipInPlace(t, graph)
	deadline := time.Now().Add(30 * time.Second)
	for {
		code, body := healthz()
		if code == http.StatusServiceUnavailable {
			if !strings.Contains(body, graph) || !strings.Contains(body, "restart") {
				t.Errorf("/healthz body %q does not name %s and say to restart", body, graph)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/healthz = %d %q 30s after model.onnx was written in place, want 503", code, body)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if err := stop(); err != nil {
		t.Errorf("scorer run: %v", err)
	}
}
