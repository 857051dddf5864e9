package bench

import (
	"strings"
	"testing"
)

// TestProductionChecks derives issue 25's targets from whole-process rows:
// each check passes or misses on its own row's figures, and a first start's
// speed adds the start-ups' difference (the calibration measured rather
// than kept) to the row's wall time.
func TestProductionChecks(t *testing.T) {
	row := func(graph, input string, pps, net, rss, speed, rssRatio float64) wholeProcess {
		return wholeProcess{Model: "m", Graph: graph, Input: input, ScorerPairsPerSec: pps, ScorerNetPairsPerSec: net,
			ScorerPeakRSSMiB: rss, RawSeconds: 24, ScorerSeconds: 24 / speed, SpeedRatio: speed, RSSRatio: rssRatio}
	}
	startups := []startupPoint{
		{Model: "m", Graph: "model.onnx", Seconds: 6.2, CachedSeconds: 5.2, CachedPeakRSSMiB: 1000, ReadySeconds: 8.5}, // typical: 24 / (24.74 + 1) = 0.93
		{Model: "m", Graph: int8File, Seconds: 4, CachedSeconds: 3.5, CachedPeakRSSMiB: 1000},                          // typical: 24 / (21.82 + 0.5) = 1.08
		{Model: "other", Graph: "model.onnx", Seconds: 100, CachedSeconds: 1},
		// Issue 35: the same graphs with external data, start-up only.
		{Model: "m-external", Graph: "model.onnx", Seconds: 6, CachedSeconds: 5, CachedPeakRSSMiB: 1040},
		{Model: "m-external", Graph: int8File, Seconds: 4, CachedSeconds: 3.5, CachedPeakRSSMiB: 1100},
	}
	rows := []wholeProcess{
		row("model.onnx", "typical", 5, 6, 2000, 0.97, 0.8),
		row("model.onnx", "long", 0.3, 0.4, 2600, 1.5, 0.3), // 1.3× typical: a miss
		row(int8File, "typical", 11, 15, 900, 1.1, 0.9),     // 2.5× fp32 after start-up
		row(int8File, "long", 0.5, 0.7, 900, 0.9, 0.4),      // 1.75×: a miss; speed 0.9: a miss
		{Model: "other", Graph: "model.onnx", Input: "typical", ScorerPeakRSSMiB: 1},
	}
	got := map[string]bool{}
	for _, c := range productionChecks("m", rows, startups) {
		got[c.Name] = c.OK
	}
	want := map[string]bool{
		"model.onnx: peak RSS long / typical":                                                false,
		int8File + ": peak RSS long / typical":                                               true,
		"int8 / fp32 peak RSS, typical":                                                      true,
		"int8 / fp32 peak RSS, long":                                                         true,
		"int8 / fp32 pairs/s after start-up, typical":                                        true,
		"int8 / fp32 pairs/s after start-up, long":                                           false,
		"model.onnx typical: scorer / raw loop pairs/s":                                      true,
		int8File + " long: scorer / raw loop pairs/s":                                        false,
		"model.onnx long: scorer / raw loop peak RSS":                                        true,
		"model.onnx typical: scorer / raw loop pairs/s, first start (calibration measured)":  false,
		"model.onnx long: scorer / raw loop pairs/s, first start (calibration measured)":     true,
		int8File + " typical: scorer / raw loop pairs/s, first start (calibration measured)": true,
		int8File + " long: scorer / raw loop pairs/s, first start (calibration measured)":    false,
		"model.onnx: start-up peak RSS, external data / inline":                              true,  // 1.04
		int8File + ": start-up peak RSS, external data / inline":                             false, // 1.1
		"model.onnx typical: scorer peak RSS, GB":                                            false, // 2.10
		int8File + " typical: scorer peak RSS, GB":                                           true,  // 0.94
		int8File + " long: scorer peak RSS, GB":                                              true,
		"model.onnx: start-up, caches warm (scorer score, one sentence), s":                  true,  // 5.2 s
		"model.onnx: scorer run until /readyz, caches warm, s":                               false, // 8.5 s
	}
	// Issue 32's checks only where the rewrite A/B ran.
	for name := range got {
		if strings.Contains(name, "rewrite") {
			t.Errorf("%s: a rewrite check without the A/B's rows", name)
		}
	}
	for name, ok := range want {
		if g, found := got[name]; !found || g != ok {
			t.Errorf("%s: got ok=%v (found %v), want %v", name, g, found, ok)
		}
	}
}

// TestRunProcPeakIsTheChilds: a small child of a large process reports its
// own peak resident set, not its parent's (wait4's ru_maxrss carries the
// parent's across a vfork'd exec, which made both sides of the small
// models' whole-process rows read the bench's own peak).
func TestRunProcPeakIsTheChilds(t *testing.T) {
	big := make([]byte, 300<<20)
	for i := range big {
		big[i] = byte(i)
	}
	r, err := runProc(t.Context(), nil, "sleep", "0.3")
	if err != nil {
		t.Fatal(err)
	}
	if r.peakRSSMiB <= 0 || r.peakRSSMiB > 50 {
		t.Errorf("sleep's peak RSS %.1f MiB beside a parent holding 300 MiB; want its own few MiB", r.peakRSSMiB)
	}
	t.Logf("parent touched %d MiB; sleep peaked at %.1f MiB", len(big)>>20, r.peakRSSMiB)
}

// TestRewriteChecks derives issue 32's targets from rows that ran the
// rewrite A/B: each input has its own speed target against the raw loop,
// int8 is held to the same, and the peak RSS may not exceed the
// unrewritten scorer's.
func TestRewriteChecks(t *testing.T) {
	rows := map[string]*wholeProcess{
		"model.onnx typical":  {RawSeconds: 10, SpeedRatio: 1.12, RewriteSpeedup: 1.1, RewriteRSSRatio: 0.98},
		"model.onnx long":     {RawSeconds: 10, SpeedRatio: 1.3, RewriteSpeedup: 1.5, RewriteRSSRatio: 1.01}, // 1.3 < 1.4; RSS up
		int8File + " long":    {RawSeconds: 10, SpeedRatio: 1.45, RewriteSpeedup: 1.6, RewriteRSSRatio: 0.9},
		int8File + " typical": {SpeedRatio: 2, RawSeconds: 10}, // no A/B: no checks
	}
	got := map[string]bool{}
	for _, c := range rewriteChecks(func(g, in string) *wholeProcess { return rows[g+" "+in] }) {
		got[c.Name] = c.OK
	}
	want := map[string]bool{
		"model.onnx typical: scorer (rewrite) / raw loop (graph as exported) pairs/s": true,
		"model.onnx typical: scorer peak RSS, rewrite / as exported":                  true,
		"model.onnx long: scorer (rewrite) / raw loop (graph as exported) pairs/s":    false,
		"model.onnx long: scorer peak RSS, rewrite / as exported":                     false,
		int8File + " long: scorer (rewrite) / raw loop (graph as exported) pairs/s":   true,
		int8File + " long: scorer peak RSS, rewrite / as exported":                    true,
	}
	if len(got) != len(want) {
		t.Errorf("got %d checks %v, want %d", len(got), got, len(want))
	}
	for name, ok := range want {
		if g, found := got[name]; !found || g != ok {
			t.Errorf("%s: got ok=%v (found %v), want %v", name, g, found, ok)
		}
	}
}
