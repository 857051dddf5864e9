package main

import (
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/scorer/scorer/internal/broker"
	"github.com/scorer/scorer/internal/testenv"
	"github.com/scorer/scorer/schema"
)

// runInProcess starts `scorer run` inside the test process (so the race
// detector sees the wiring) and returns a stop func that cancels it like
// SIGTERM and returns its error.
func runInProcess(t *testing.T, env map[string]string, args ...string) (stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	logs := &testenv.LockedBuffer{}
	go func() {
		errc <- run(ctx, append([]string{"run"}, args...), func(k string) string { return env[k] }, strings.NewReader(""), io.Discard, logs)
	}()
	var stopped bool
	var stopErr error
	stop = func() error {
		if stopped {
			return stopErr
		}
		stopped = true
		cancel()
		select {
		case stopErr = <-errc:
		case <-time.After(60 * time.Second):
			stopErr = fmt.Errorf("scorer did not stop within 60s")
		}
		return stopErr
	}
	t.Cleanup(func() {
		_ = stop()
		if t.Failed() {
			t.Logf("scorer log:\n%s", testenv.Tail(logs.String(), 6000))
		}
	})
	return stop
}

func scoreFile(t *testing.T, env map[string]string, in string) []schema.ScoredTranscript {
	t.Helper()
	out := filepath.Join(t.TempDir(), "scored.jsonl")
	cmd := exec.Command(scorerBinary(t), "score", "--in", in, "--out", out)
	cmd.Env = environ(env)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("scorer score: %v\n%s", err, testenv.Tail(string(b), 4000))
	}
	return testenv.ReadJSONL[schema.ScoredTranscript](t, out)
}

// TestRunEndToEnd is the product's main promise on the in-memory broker with
// the real model: 24 real transcripts in (8 a partition: batches of several
// at the default BATCH_MAX_MESSAGES), exactly one output each, whose scores
// equal `scorer score` on the same input; metrics and health move.
func TestRunEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end test scores 24 real transcripts twice; make test runs it")
	}
	file, events := testenv.ShortestTranscripts(t, 24)
	env := testenv.ScorerEnv(t)
	offline := scoreFile(t, env, file)
	if len(offline) != len(events) {
		t.Fatalf("scorer score wrote %d records for %d transcripts", len(offline), len(events))
	}
	want := map[string]schema.ScoredTranscript{}
	for i, st := range offline {
		if st.CallID != events[i].CallID {
			t.Fatalf("scorer score output %d is %s, want %s (order must be kept)", i, st.CallID, events[i].CallID)
		}
		want[st.CallID] = st
	}

	cluster, broker, err := broker.Start(broker.Options{Addr: "127.0.0.1:0", Partitions: 3})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Close)
	metricsAddr := freeAddr(t)
	env["KAFKA_BROKERS"] = broker
	env["METRICS_ADDR"] = metricsAddr
	env["KAFKA_INPUT_PARTITIONS"] = "3"
	stop := runInProcess(t, env)

	waitReady(t, metricsAddr, 60*time.Second)
	if n := produceFile(t, broker, "transcripts", file); n != len(events) {
		t.Fatalf("produced %d of %d", n, len(events))
	}
	msgs := readTopic(t, broker, "transcripts.scored", len(events), 10*time.Minute)
	got := decodeScored(t, msgs)
	if len(got) != len(events) {
		t.Fatalf("got %d outputs for %d inputs", len(got), len(events))
	}
	seen := map[string]bool{}
	for i, st := range got {
		if seen[st.CallID] {
			t.Errorf("duplicate output for %s", st.CallID)
		}
		seen[st.CallID] = true
		if string(msgs[i].Key) != st.CallID {
			t.Errorf("output key %q, want call_id %q", msgs[i].Key, st.CallID)
		}
		if st.Source == nil || st.Source.Topic != "transcripts" {
			t.Errorf("%s: source = %+v", st.CallID, st.Source)
		}
		w, ok := want[st.CallID]
		if !ok {
			t.Errorf("output for unknown call %s", st.CallID)
			continue
		}
		compareScored(t, w, st)
	}

	// Metrics moved: messages in and pairs scored count what went through.
	metrics := testenv.Scrape(t, metricsAddr)
	pairs := 0
	for _, ev := range events {
		pairs += ev.SentenceCount() * 3
	}
	// Every pair is looked up in the score cache; only misses reach the
	// model, each distinct one once, so fewer pairs are inferred.
	lookups := testenv.MetricValue(metrics, "scorer_score_cache_hits_total") + testenv.MetricValue(metrics, "scorer_score_cache_misses_total")
	if lookups < float64(pairs) {
		t.Errorf("score cache hits + misses = %v, want >= %d", lookups, pairs)
	}
	if v := testenv.MetricValue(metrics, "scorer_pairs_scored_total"); v <= 0 || v > lookups {
		t.Errorf("scorer_pairs_scored_total = %v, want 1..%v (the cache's misses)", v, lookups)
	}
	if v := testenv.MetricValue(metrics, `scorer_messages_in_total{topic="transcripts"}`); v != float64(len(events)) {
		t.Errorf("scorer_messages_in_total = %v, want %d", v, len(events))
	}
	if v := testenv.MetricValue(metrics, "scorer_ready"); v != 1 {
		t.Errorf("scorer_ready = %v, want 1", v)
	}
	if v := testenv.MetricValue(metrics, `scorer_messages_out_total{kind="result",topic="transcripts.scored"}`); v != float64(len(events)) {
		t.Errorf("scorer_messages_out_total results = %v, want %d", v, len(events))
	}
	if v := testenv.MetricValue(metrics, "scorer_end_to_end_seconds_count"); v != float64(len(events)) {
		t.Errorf("scorer_end_to_end_seconds_count = %v, want %d", v, len(events))
	}
	if v := testenv.MetricValue(metrics, "scorer_batch_padding_ratio_count"); v < 1 {
		t.Errorf("scorer_batch_padding_ratio observed %v batches", v)
	}
	if v := testenv.MetricValue(metrics, "scorer_assigned_partitions"); v != 3 {
		t.Errorf("scorer_assigned_partitions = %v, want 3", v)
	}
	resp, err := http.Get("http://" + metricsAddr + "/healthz")
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Errorf("/healthz: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}
	if err := stop(); err != nil {
		t.Fatalf("graceful stop: %v", err)
	}
}

// compareScored asserts two results for the same transcript agree: same
// shape, scores within 1e-5 (batches differ in padding), same decisions.
func compareScored(t *testing.T, want, got schema.ScoredTranscript) {
	t.Helper()
	if want.Model != got.Model || want.Threshold != got.Threshold || strings.Join(want.Labels, "|") != strings.Join(got.Labels, "|") {
		t.Errorf("%s: header differs: %+v vs %+v", got.CallID, want.Model, got.Model)
	}
	if len(want.Sections) != len(got.Sections) {
		t.Errorf("%s: %d sections, want %d", got.CallID, len(got.Sections), len(want.Sections))
	}
	for name, ws := range want.Sections {
		gs := got.Sections[name]
		if gs.Sentences != ws.Sentences {
			t.Errorf("%s/%s: %d sentences, want %d", got.CallID, name, gs.Sentences, ws.Sentences)
		}
		for label, wr := range ws.Results {
			gr := gs.Results[label]
			if len(gr.Scores) != len(wr.Scores) {
				t.Errorf("%s/%s/%s: %d scores, want %d", got.CallID, name, label, len(gr.Scores), len(wr.Scores))
				continue
			}
			for i := range wr.Scores {
				if math.Abs(float64(gr.Scores[i]-wr.Scores[i])) > 1e-5 {
					t.Errorf("%s/%s/%s[%d]: score %v, want %v", got.CallID, name, label, i, gr.Scores[i], wr.Scores[i])
				}
				if gr.Flags[i] != wr.Flags[i] {
					t.Errorf("%s/%s/%s[%d]: flag %d, want %d", got.CallID, name, label, i, gr.Flags[i], wr.Flags[i])
				}
			}
		}
	}
}

func waitReady(t *testing.T, addr string, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		resp, err := http.Get("http://" + addr + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("/readyz on %s not ready within %v", addr, timeout)
}
