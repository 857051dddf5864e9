package main

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/scorer/scorer/internal/testenv"
	"github.com/scorer/scorer/schema"
)

// TestReliabilityCrashKill9 is the crash drill: `scorer broker` as its own
// process, 3 000 small real-text transcripts, the scorer process killed
// with SIGKILL at random points five times and restarted. Every input must
// have an output; an input may be scored twice only if its offset was not
// committed when a kill happened (it was in flight); at the end the group's
// commits reach the end of every partition.
//
// The kill points are counted, not timed: each incarnation dies after a
// random 100 to 400 new outputs (duplicates included), so the five kills
// come before at most about 5 × 400 of the 3 000 inputs are scored, on any
// machine, and the last incarnation still has hundreds to score. (They
// were 200 outputs and then a random 0–2 s, which on a fast machine could
// be thousands of outputs, so n was 10 000, and most of the drill, 80 s of
// its 144 on two cores, was the last incarnation scoring the 8 400 left.)
func TestReliabilityCrashKill9(t *testing.T) {
	if testing.Short() {
		t.Skip("crash drill: 3 000 transcripts, five SIGKILLs")
	}
	const (
		n     = 3000
		kills = 5
		group = "crash-drill"
	)
	start := time.Now()
	broker := startBrokerProcess(t, 6)
	ids := produceSmallEvents(t, broker, n, "CRASH")
	parts := partitionsOf(t, broker, "transcripts", nil)
	out := watchTopic(t, broker, "transcripts.scored", nil)
	env := relEnv(t, "KAFKA_BROKERS", broker, "KAFKA_GROUP_ID", group, "LABELS", "consumer weakness")

	seed := uint64(time.Now().UnixNano())
	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	t.Logf("kill points seeded with %d", seed)
	var committedAtKill []map[int]int64
	for k := range kills {
		p := startScorerProcess(t, env)
		before := out.len()
		// Work must be flowing in this incarnation before it dies: a random
		// 100 to 400 new outputs (polled every 50 ms), whatever the
		// machine's speed.
		want := 100 + rng.IntN(301)
		waitUntil(t, 3*time.Minute, fmt.Sprintf("kill %d: %d new outputs", k+1, want), func() bool { return out.len() >= before+want },
			func() string {
				return fmt.Sprintf("%d outputs; log: %s", out.len(), testenv.Tail(p.log.String(), 1500))
			})
		c := committedOffsets(t, broker, group, "transcripts", parts)
		if d, _ := signalAndWait(t, p, syscall.SIGKILL, 10*time.Second); d > 5*time.Second {
			t.Errorf("SIGKILL took %v", d)
		}
		committedAtKill = append(committedAtKill, c)
		t.Logf("kill %d at %v after %d new outputs: %d outputs so far, committed %v", k+1, time.Since(start).Round(time.Second), want, out.len(), c)
		if out.distinctKeys() >= n {
			t.Fatalf("all %d transcripts were scored before kill %d: the drill must kill mid-stream (grow n)", n, k+1)
		}
	}

	final := startScorerProcess(t, env)
	out.waitKeys(t, n, 5*time.Minute)
	waitCommittedToEnd(t, broker, group, "transcripts", time.Minute)
	if d, err := signalAndWait(t, final, syscall.SIGTERM, 40*time.Second); err != nil {
		t.Errorf("final scorer exited with %v after SIGTERM (%v)", err, d)
	}

	msgs, bySrc, byCall := checkAllScored(t, broker, out, ids)
	if len(byCall) != n {
		t.Errorf("%d distinct call_ids in the output, want %d", len(byCall), n)
	}
	// Duplicates: same call_id and source offset, scored again later, and
	// only for offsets that were not committed at some kill.
	dups := 0
	var dupKeys []sourceKey
	for k, sts := range bySrc {
		if len(sts) < 2 {
			continue
		}
		dups += len(sts) - 1
		dupKeys = append(dupKeys, k)
		inflight := false
		for _, c := range committedAtKill {
			if committed, ok := c[k.partition]; !ok || committed < 0 || k.offset >= committed {
				inflight = true
			}
		}
		if !inflight {
			t.Errorf("input %d/%d scored %d times but was committed before every kill", k.partition, k.offset, len(sts))
		}
		for _, st := range sts[1:] {
			if st.CallID != sts[0].CallID {
				t.Errorf("input %d/%d: outputs for %s and %s", k.partition, k.offset, sts[0].CallID, st.CallID)
			}
			if scoredAt(t, st).Before(scoredAt(t, sts[0])) {
				t.Errorf("input %d/%d: duplicate scored_at %v before first %v", k.partition, k.offset, st.ScoredAt, sts[0].ScoredAt)
			}
		}
	}
	sort.Slice(dupKeys, func(i, j int) bool {
		return dupKeys[i].partition < dupKeys[j].partition || dupKeys[i].partition == dupKeys[j].partition && dupKeys[i].offset < dupKeys[j].offset
	})
	// The in-flight bound: per kill, at most what one commit interval (1 s)
	// plus the pipeline (MAX_INFLIGHT_BATCHES × BATCH_MAX_MESSAGES per
	// process) can hold; on two cores that is a few hundred at most.
	if limit := kills * 600; dups > limit {
		t.Errorf("%d duplicates over %d kills, more than in-flight work can explain (%d)", dups, kills, limit)
	}
	t.Logf("crash drill: %d inputs, %d outputs, %d duplicates (%.2f%%) after %d SIGKILLs, %v in all",
		n, len(msgs), dups, 100*float64(dups)/float64(n), kills, time.Since(start).Round(time.Second))
	if len(dupKeys) > 0 {
		k := dupKeys[0]
		a, b := bySrc[k][0], bySrc[k][1]
		t.Logf("a duplicate: call_id %s, source %s/%d/%d, scored_at %s then %s", a.CallID, a.Source.Topic, k.partition, k.offset,
			a.ScoredAt, b.ScoredAt)
	}
}

// TestReliabilitySigtermDuringLongBatch: SIGTERM while one long transcript
// is being scored. The scorer must exit 0 within SHUTDOWN_TIMEOUT (plus
// process teardown), publish nothing for the abandoned work, not commit
// past it, and a restart must score it exactly once.
func TestReliabilitySigtermDuringLongBatch(t *testing.T) {
	if testing.Short() {
		t.Skip("scores one long transcript twice")
	}
	// The transcript must still be scoring when the drain (SHUTDOWN_TIMEOUT
	// less its reserve: 1.5 s) runs out. SIGTERM is sent once its first
	// inference batch is done, not at a fixed time after start-up, so what
	// is left then is nearly all of it: 4 000 pairs, about 4 s on two
	// cores. (It was 8 000 pairs and SIGTERM 1.5 s after the generation
	// started, about the same margin at twice the scoring, done twice.)
	const (
		shutdown = 2 * time.Second
		n        = 4000
	)
	sents := corpusSentences(t, 40, 160)
	ev := map[string]any{"call_id": "LONG-1", "entity_id": "REL", "sections": map[string][]string{"FILT_MD": sents[:n]}}
	b, err := json.Marshal(ev)
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "long.jsonl")
	if err := os.WriteFile(file, append(b, '\n'), 0o644); err != nil {
		t.Fatal(err)
	}
	broker := startBrokerProcess(t, 1)
	produceFile(t, broker, "transcripts", file)
	metrics := freeAddr(t)
	env := relEnv(t, "KAFKA_BROKERS", broker, "KAFKA_GROUP_ID", "long", "LABELS", "consumer weakness",
		"SHUTDOWN_TIMEOUT", shutdown.String(), "KAFKA_INPUT_PARTITIONS", "1", "METRICS_ADDR", metrics)

	p := startScorerProcess(t, env)
	var pairs float64
	waitUntil(t, 2*time.Minute, "the transcript's first scored batch", func() bool {
		resp, err := http.Get("http://" + metrics + "/metrics")
		if err != nil {
			return false // not listening yet
		}
		resp.Body.Close()
		pairs = testenv.MetricValue(testenv.Scrape(t, metrics), "scorer_pairs_scored_total")
		return pairs > 0
	}, func() string { return testenv.Tail(p.log.String(), 1500) })
	if pairs >= n {
		t.Fatalf("%v pairs scored at the first look: the whole transcript was done before SIGTERM (grow n)", pairs)
	}
	took, err := signalAndWait(t, p, syscall.SIGTERM, shutdown+20*time.Second)
	if err != nil {
		t.Errorf("exit after SIGTERM: %v, want 0", err)
	}
	if took > shutdown+5*time.Second {
		t.Errorf("exit took %v, SHUTDOWN_TIMEOUT is %v", took, shutdown)
	}
	logText := p.log.String()
	if !strings.Contains(logText, "work in flight") {
		t.Errorf("no 'work in flight' line: the batch finished before SIGTERM, so the test proved nothing; log:\n%s", testenv.Tail(logText, 3000))
	}
	if msgs := readTopic(t, broker, "transcripts.scored", 1, 2*time.Second); len(msgs) != 0 {
		t.Fatalf("abandoned work was published: %d records", len(msgs))
	}
	if c := committedOffsets(t, broker, "long", "transcripts", []int{0}); c[0] > 0 {
		t.Fatalf("committed offset %d past the abandoned record", c[0])
	}
	t.Logf("SIGTERM with %v of %d pairs scored: exit 0 after %v (SHUTDOWN_TIMEOUT %v)", pairs, n, took.Round(time.Millisecond), shutdown)

	restart := time.Now()
	p2 := startScorerProcess(t, withEnv(env, "SHUTDOWN_TIMEOUT", "30s"))
	msgs := readTopic(t, broker, "transcripts.scored", 1, 3*time.Minute)
	t.Logf("the restart published it %v after it started (model load and group join included)", time.Since(restart).Round(time.Millisecond))
	if len(msgs) != 1 {
		t.Fatalf("after restart %d outputs, want 1", len(msgs))
	}
	waitCommittedToEnd(t, broker, "long", "transcripts", 30*time.Second)
	if _, err := signalAndWait(t, p2, syscall.SIGTERM, 40*time.Second); err != nil {
		t.Errorf("restart exit: %v", err)
	}
	if all := readTopic(t, broker, "transcripts.scored", 2, 2*time.Second); len(all) != 1 {
		t.Errorf("%d outputs in the end, want exactly 1", len(all))
	}
	st := decodeScored(t, msgs)[0]
	if st.CallID != "LONG-1" || st.Sections["FILT_MD"].Sentences != n {
		t.Errorf("output %s with %d sentences", st.CallID, st.Sections["FILT_MD"].Sentences)
	}
}

func scoredAt(t testing.TB, st schema.ScoredTranscript) time.Time {
	t.Helper()
	ts, err := time.Parse(time.RFC3339Nano, st.ScoredAt)
	if err != nil {
		t.Fatalf("%s: scored_at %q: %v", st.CallID, st.ScoredAt, err)
	}
	return ts
}
