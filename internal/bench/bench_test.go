package bench

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/scorer/scorer/internal/produce"
	"github.com/scorer/scorer/model"
	"github.com/scorer/scorer/schema"
)

// These check the benchmark's arithmetic only; the benchmark itself runs
// from `make bench`, never from `make test`.

func pairsOfLen(ls ...int) []model.Pair {
	out := make([]model.Pair, len(ls))
	for i, l := range ls {
		out[i] = model.Pair{IDs: make([]int32, l), TypeIDs: make([]int32, l)}
	}
	return out
}

func TestArrivalPadding(t *testing.T) {
	// Rows cap at 2: [10 2] [8 8] [1] → padded 20 + 16 + 1.
	real, padded := arrivalPadding([][]model.Pair{pairsOfLen(10, 2, 8, 8, 1)}, 1000, 2)
	if real != 29 || padded != 37 {
		t.Fatalf("rows cap: real %d padded %d, want 29 37", real, padded)
	}
	// Token budget 20: [10 2] (20) then 8 would make 3×10 > 20 → [8 8 1]? 3×8=24 > 20 → [8 8] [1].
	real, padded = arrivalPadding([][]model.Pair{pairsOfLen(10, 2, 8, 8, 1)}, 20, 100)
	if real != 29 || padded != 37 {
		t.Fatalf("token budget: real %d padded %d, want 29 37", real, padded)
	}
	// Calls are never mixed in one batch.
	_, padded = arrivalPadding([][]model.Pair{pairsOfLen(5), pairsOfLen(1)}, 1000, 100)
	if padded != 6 {
		t.Fatalf("two calls: padded %d, want 6", padded)
	}
}

func TestPercentile(t *testing.T) {
	var ds []time.Duration
	for i := 1; i <= 100; i++ {
		ds = append(ds, time.Duration(i)*time.Millisecond)
	}
	for q, want := range map[float64]time.Duration{0.5: 50 * time.Millisecond, 0.95: 95 * time.Millisecond, 0.99: 99 * time.Millisecond, 1: 100 * time.Millisecond} {
		if got := percentile(ds, q); got != want {
			t.Errorf("p%v = %v, want %v", q, got, want)
		}
	}
	if percentile(nil, 0.5) != 0 {
		t.Error("empty percentile not 0")
	}
}

func TestSpreadSampleAndRepeat(t *testing.T) {
	var lines []corpusLine
	for i := 0; i < 10; i++ {
		raw, _ := json.Marshal(map[string]any{"call_id": string(rune('a' + i)), "sections": map[string][]string{"A": make([]string, 10-i)}})
		lines = append(lines, corpusLine{raw: raw, ev: schema.TranscriptEvent{CallID: string(rune('a' + i))}, sentences: 10 - i})
	}
	s := spreadSample(lines, 2)
	if len(s) != 2 || s[0].sentences != 3 || s[1].sentences != 8 {
		t.Fatalf("spread sample sizes %d, %d; want 3 and 8", s[0].sentences, s[1].sentences)
	}
	if sh := shortest(lines, 3); sh[0].sentences != 1 || sh[2].sentences != 3 {
		t.Fatalf("shortest: %d..%d", sh[0].sentences, sh[2].sentences)
	}
	recs, err := repeatCorpus(lines[:2], 5)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, r := range recs {
		k := string(produce.EventKey(r))
		if seen[k] {
			t.Fatalf("call_id %q repeated", k)
		}
		seen[k] = true
	}
	if !seen["a#r2"] {
		t.Fatalf("want a#r2 among %v", seen)
	}
}

func TestScrapeMetric(t *testing.T) {
	text := []byte("# HELP x\nscorer_messages_in_total{topic=\"t\"} 7\nscorer_messages_in_total_other 100\nscorer_messages_out_total{kind=\"result\",topic=\"o\"} 2\nscorer_messages_out_total{kind=\"dlq\",topic=\"d\"} 1\n")
	if got := scrapeMetric(text, "scorer_messages_in_total"); got != 7 {
		t.Errorf("in = %v, want 7", got)
	}
	if got := scrapeMetric(text, "scorer_messages_out_total"); got != 3 {
		t.Errorf("out = %v, want 3", got)
	}
	if got := scrapeMetric(text, "absent"); got != -1 {
		t.Errorf("absent = %v, want -1", got)
	}
}

func TestSplitTime(t *testing.T) {
	t0 := time.Unix(1000, 0)
	r := &pipelineRun{first: t0, last: t0.Add(100 * time.Millisecond), rec: &batchRecorder{batches: []recordedBatch{
		{start: t0.Add(10 * time.Millisecond), dur: 20 * time.Millisecond},
		{start: t0.Add(40 * time.Millisecond), dur: 30 * time.Millisecond},
		{start: t0.Add(50 * time.Millisecond), dur: 10 * time.Millisecond}, // overlaps the one before
	}}}
	got := splitTime(r)
	want := timeSplit{LeadInMs: 10, EngineMs: 50, IdleGapsMs: 10, TailMs: 30}
	if got != want {
		t.Fatalf("split = %+v, want %+v", got, want)
	}
}

// The pipeline table has a GPU busy row only when a model ran on a GPU:
// a CPU-only report has none, and a CPU model beside a GPU one reads n/a.
func TestPrintTableGPUBusy(t *testing.T) {
	all := func(string) bool { return true }
	cpu := modelReport{Model: "cpu-model", Throughput: throughputResult{Pairs: 10, PipelinePairsPerSec: 5}}
	var b strings.Builder
	printTable(&b, &benchReport{Models: []modelReport{cpu}}, all)
	if strings.Contains(b.String(), "GPU busy") {
		t.Errorf("a CPU-only report speaks of GPU busy:\n%s", b.String())
	}
	busy := 0.874
	gpu := modelReport{Model: "gpu-model", Throughput: throughputResult{Pairs: 10, PipelinePairsPerSec: 5, GPUBusy: &busy}}
	b.Reset()
	printTable(&b, &benchReport{Models: []modelReport{gpu, cpu}}, all)
	var line string
	for _, l := range strings.Split(b.String(), "\n") {
		if strings.HasPrefix(l, "GPU busy") {
			line = l
		}
	}
	if f := strings.Fields(line); len(f) < 2 || f[len(f)-2] != "0.874" || f[len(f)-1] != "n/a" {
		t.Errorf("GPU busy row = %q, want 0.874 then n/a:\n%s", line, b.String())
	}
}
