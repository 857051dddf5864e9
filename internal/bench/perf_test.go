package bench

import (
	"bytes"
	"strings"
	"testing"

	"github.com/scorer/scorer/schema"
)

func TestRevisionWorkload(t *testing.T) {
	var sents []string
	for i := range 2000 {
		sents = append(sents, "Sentence number "+strings.Repeat("x", i%7)+" here.")
	}
	evs := []schema.TranscriptEvent{{CallID: "c1", Sections: map[string][]string{"FILT_MD": sents}}}
	work := revisionWorkload(evs, 3, 0.05)
	if len(work) != 3 {
		t.Fatalf("%d versions", len(work))
	}
	if work[0][0].Sections["FILT_MD"][5] != sents[5] || work[0][0].VersionID != "1" || work[2][0].VersionID != "3" {
		t.Error("version 1 must be the transcript as is")
	}
	for v := 1; v < 3; v++ {
		prev, cur := work[v-1][0].Sections["FILT_MD"], work[v][0].Sections["FILT_MD"]
		edited := 0
		for j := range cur {
			if cur[j] != prev[j] {
				edited++
			}
		}
		if edited < 60 || edited > 140 { // 5% of 2000 = 100
			t.Errorf("version %d edits %d of 2000 sentences, want about 100", v+1, edited)
		}
	}
	again := revisionWorkload(evs, 3, 0.05)
	for j, s := range again[2][0].Sections["FILT_MD"] {
		if s != work[2][0].Sections["FILT_MD"][j] {
			t.Fatal("the workload differs between runs")
		}
	}
	if evs[0].Sections["FILT_MD"][0] != sents[0] || evs[0].VersionID != "" {
		t.Error("the input events were modified")
	}
}

func TestParsePlansAndPerfTable(t *testing.T) {
	plans, err := parsePlans("2x1, 1x2")
	if err != nil || len(plans) != 2 || plans[0].Workers != 2 || plans[1].Threads != 2 {
		t.Errorf("parsePlans: %+v, %v", plans, err)
	}
	for _, bad := range []string{"", "2", "2x", "0x1", "ax1"} {
		if _, err := parsePlans(bad); err == nil {
			t.Errorf("parsePlans(%q) accepted", bad)
		}
	}
	s8 := cpuShape{Rows: 8, Tokens: 16384, Workers: 2, Threads: 1}
	s256 := cpuShape{Rows: 256, Tokens: 16384, Workers: 2, Threads: 1}
	ps := []perfReport{{
		Model:    "m",
		Shapes:   []shapePoint{{cpuShape: s8, PairsPerSec: 1000, PairsPerCPUSec: 500}, {cpuShape: s256, PairsPerSec: 800, PairsPerCPUSec: 400}},
		Revision: &revisionResult{Transcripts: 2, Versions: 3, EditShare: 0.05, Pairs: 300, InferredOff: 300, InferredOn: 100, Saved: 2.0 / 3, SavedTarget: 0.6, Speedup: 2.6, CPUSpeedup: 2.4, SpeedupTarget: 2.5, CappedBytes: 10, CappedCapBytes: 20},
		Int8:     &int8Result{FP32PairsPerSec: 500, Int8PairsPerSec: 950, Speedup: 1.9, Agreement05: 0.999},
	}, {Model: "large"}}
	var b bytes.Buffer
	printPerfTable(&b, ps, func(string) bool { return true })
	for _, want := range []string{"1000.0; 500.0 best", "800.0; 400.0 (0.80)", "66.7% ok", "2.60×; 2.40× ok", "(1.90×)", "99.90%"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("perf table lacks %q:\n%s", want, b.String())
		}
	}
}
