package bench

import "testing"

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
		{Model: "m", Graph: "model.onnx", Seconds: 6.2, CachedSeconds: 5.2}, // typical: 24 / (24.74 + 1) = 0.93
		{Model: "m", Graph: int8File, Seconds: 4, CachedSeconds: 3.5},       // typical: 24 / (21.82 + 0.5) = 1.08
		{Model: "other", Graph: "model.onnx", Seconds: 100, CachedSeconds: 1},
	}
	rows := []wholeProcess{
		row("model.onnx", "typical", 5, 6, 2000, 0.97, 0.8),
		row("model.onnx", "long", 0.3, 0.4, 2600, 1.5, 0.3), // 1.3× typical: a miss
		row(int8File, "typical", 11, 15, 1300, 1.1, 0.9),    // 2.5× fp32 after start-up
		row(int8File, "long", 0.5, 0.7, 1300, 0.9, 0.4),     // 1.75×: a miss; speed 0.9: a miss
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
