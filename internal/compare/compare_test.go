package compare

import (
	"bytes"
	"context"
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/scorer/scorer/schema"
)

// scored builds one transcript's results: per label, one score per
// sentence of the single section "S".
func scored(id string, texts []string, labels []string, scores map[string][]float32) schema.ScoredTranscript {
	res := map[string]schema.LabelResult{}
	for _, l := range labels {
		res[l] = schema.LabelResult{Scores: scores[l]}
	}
	return schema.ScoredTranscript{CallID: id, Labels: labels,
		Sections: map[string]schema.SectionResult{"S": {Sentences: len(texts), Text: texts, Results: res}}}
}

func TestCompareArithmetic(t *testing.T) {
	labels := []string{"x", "y"}
	texts := []string{"s0", "s1", "s2", "s3", "s4"}
	a := Run{Name: "A", Pairs: 10, Seconds: 2, Results: []schema.ScoredTranscript{scored("c1", texts, labels, map[string][]float32{
		"x": {0.10, 0.60, 0.40, 0.90, 0.5},
		"y": {0.20, 0.20, 0.20, 0.20, 0.20},
	})}}
	b := Run{Name: "B", Pairs: 10, Seconds: 1, Results: []schema.ScoredTranscript{scored("c1", texts, labels, map[string][]float32{
		"x": {0.10, 0.45, 0.55, 0.90, 0.5}, // s1 and s2 flip at 0.5; s4 = 0.5 is "not above" on both sides
		"y": {0.20, 0.25, 0.20, 0.20, 0.20},
	})}}
	rep, err := Compare(a, b, Options{Threshold: 0.5, MinAgreement: 0.7, Flips: 1})
	if err != nil {
		t.Fatal(err)
	}
	near := func(got, want float64) bool { return math.Abs(got-want) < 1e-6 }
	// |Δp| sorted: 0×7, 0.05, 0.15, 0.15.
	if rep.Pairs != 10 || !near(rep.MaxAbsDiff, 0.15) || !near(rep.P50AbsDiff, 0) || !near(rep.P99AbsDiff, 0.15) || !near(rep.MeanAbsDiff, 0.035) {
		t.Errorf("diffs: pairs %d max %v p50 %v p99 %v mean %v", rep.Pairs, rep.MaxAbsDiff, rep.P50AbsDiff, rep.P99AbsDiff, rep.MeanAbsDiff)
	}
	if len(rep.Labels) != 2 || rep.Labels[0].Label != "x" || rep.Labels[0].Agree != 3 || !near(rep.Labels[0].Agreement, 0.6) ||
		rep.Labels[0].OnlyA != 1 || rep.Labels[0].OnlyB != 1 || rep.Labels[1].Agree != 5 || rep.Labels[1].Agreement != 1 {
		t.Errorf("labels %+v", rep.Labels)
	}
	if !near(rep.Agreement, 0.8) || rep.FlipCount != 2 || len(rep.Flips) != 1 {
		t.Errorf("agreement %v, %d flips, %d listed", rep.Agreement, rep.FlipCount, len(rep.Flips))
	}
	if f := rep.Flips[0]; f.Sentence != 1 && f.Sentence != 2 || f.Label != "x" || f.CallID != "c1" || f.Text != texts[f.Sentence] {
		t.Errorf("flip %+v", f)
	}
	if rep.Pass { // label x is at 0.6 < 0.7 although the overall 0.8 is above
		t.Error("passed with one label below --min-agreement")
	}
	if rep.A.PairsPerSec != 5 || rep.B.PairsPerSec != 10 {
		t.Errorf("throughput A %v B %v", rep.A.PairsPerSec, rep.B.PairsPerSec)
	}
	if rep, _ := Compare(a, b, Options{Threshold: 0.5, MinAgreement: 0.6}); !rep.Pass {
		t.Error("failed at exactly the minimum agreement")
	}
	// The same run against itself: no difference, full agreement.
	if rep, _ := Compare(a, a, Options{Threshold: 0.5, MinAgreement: 1}); !rep.Pass || rep.MaxAbsDiff != 0 || rep.FlipCount != 0 {
		t.Errorf("self-comparison %+v", rep)
	}

	var out bytes.Buffer
	if err := rep.WriteText(&out); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"pairs 10", "max 0.150000", "80.0000% overall (2 flips)", "60.0000%", "FAIL", `"s`} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("text report lacks %q:\n%s", want, out.String())
		}
	}
}

func TestCompareMismatch(t *testing.T) {
	labels := []string{"x"}
	base := Run{Results: []schema.ScoredTranscript{scored("c1", []string{"a"}, labels, map[string][]float32{"x": {0.1}})}}
	for name, other := range map[string]Run{
		"transcript count": {},
		"call id":          {Results: []schema.ScoredTranscript{scored("c2", []string{"a"}, labels, map[string][]float32{"x": {0.1}})}},
		"labels":           {Results: []schema.ScoredTranscript{scored("c1", []string{"a"}, []string{"z"}, map[string][]float32{"z": {0.1}})}},
		"sentences":        {Results: []schema.ScoredTranscript{scored("c1", []string{"a", "b"}, labels, map[string][]float32{"x": {0.1, 0.2}})}},
		"scores":           {Results: []schema.ScoredTranscript{scored("c1", []string{"a"}, labels, map[string][]float32{"x": {}})}},
	} {
		if _, err := Compare(base, other, Options{Threshold: 0.5}); err == nil {
			t.Errorf("%s: mismatch accepted", name)
		}
	}
	if _, err := Compare(base, base, Options{Threshold: 1.5}); err == nil {
		t.Error("threshold 1.5 accepted")
	}
	if _, err := Compare(base, base, Options{Threshold: 0.5, MinAgreement: -1}); err == nil {
		t.Error("min agreement -1 accepted")
	}
	empty := Run{Results: []schema.ScoredTranscript{scored("c1", nil, labels, nil)}}
	if _, err := Compare(empty, empty, Options{Threshold: 0.5}); err == nil {
		t.Error("nothing to compare, yet no error")
	}
}

type fakeScorer struct{ calls int }

func (f *fakeScorer) Score(_ context.Context, evs []schema.TranscriptEvent) ([]schema.ScoredTranscript, error) {
	f.calls++
	if f.calls > 2 {
		return nil, errors.New("boom")
	}
	var out []schema.ScoredTranscript
	for _, ev := range evs {
		out = append(out, scored(ev.CallID, ev.Sections["S"], []string{"x", "y"}, nil))
	}
	return out, nil
}

func TestScoreTranscriptsAndReadEvents(t *testing.T) {
	in := `{"call_id":"a","sections":{"S":["one","two"]}}` + "\n\n" + `{"call_id":"b","sections":{"S":["three"]}}` + "\n" +
		`{"call_id":"c","sections":{"S":["four"]}}` + "\n"
	evs, err := ReadEvents(strings.NewReader(in), schema.DefaultLimits(), 2)
	if err != nil || len(evs) != 2 || evs[1].CallID != "b" {
		t.Fatalf("ReadEvents: %v, %+v", err, evs)
	}
	if _, err := ReadEvents(strings.NewReader(in+"{bad\n"), schema.DefaultLimits(), 0); err == nil || !strings.Contains(err.Error(), "line 5") {
		t.Errorf("bad line: %v", err)
	}
	if _, err := ReadEvents(strings.NewReader("\n"), schema.DefaultLimits(), 0); err == nil {
		t.Error("empty input accepted")
	}
	f := &fakeScorer{}
	r, err := ScoreTranscripts(t.Context(), "fake", f, evs, 1)
	if err != nil || r.Pairs != 6 || len(r.Results) != 2 || f.calls != 2 {
		t.Errorf("ScoreTranscripts: %v, %d pairs, %d results, %d calls", err, r.Pairs, len(r.Results), f.calls)
	}
	if _, err := ScoreTranscripts(t.Context(), "fake", f, evs, 1); err == nil || !strings.Contains(err.Error(), "fake") {
		t.Errorf("a failing scorer: %v", err)
	}
}
