package fanout

import (
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/scorer/scorer/internal/testenv"
	"github.com/scorer/scorer/model"
)

// TestTranscriptScorerJoined checks that TranscriptScorer under joined
// encoding sends exactly EncodeText's pairs, labels its records with the
// encoding, and that the encoding matters: on nli-deberta-v3-tiny the
// same sentences score differently as pairs and joined.
func TestTranscriptScorerJoined(t *testing.T) {
	dir := testenv.ModelDir(t, "nli-deberta-v3-tiny")
	joined := sharedLoad(t, model.LoadOptions{Dir: dir, PairEncoding: model.EncodeJoined})
	plain := sharedLoad(t, model.LoadOptions{Dir: dir})
	if joined.PairSeparator != model.DefaultPairSeparator || plain.PairSeparator != "" || plain.PairEncoding != model.EncodePair {
		t.Fatalf("separators: joined %q, pair %q (%s)", joined.PairSeparator, plain.PairSeparator, plain.PairEncoding)
	}
	events := testenv.FirstTranscripts(t, 2, 6)
	lc := DefaultLabelConfig()

	fake := &fakeScorer{}
	ts, err := NewTranscriptScorer(joined, lc, fake)
	if err != nil {
		t.Fatal(err)
	}
	out, err := ts.Score(t.Context(), events)
	if err != nil {
		t.Fatal(err)
	}
	pairs, k := fake.calls[0], 0
	for i, ev := range events {
		if out[i].PairEncoding != "joined" || out[i].PairSeparator != "</s></s>" {
			t.Errorf("record %d: pair_encoding %q separator %q", i, out[i].PairEncoding, out[i].PairSeparator)
		}
		for _, sec := range ev.SectionNames() {
			for _, sent := range ev.Sections[sec] {
				for _, h := range lc.Hypotheses() {
					want, err := joined.EncodeText(sent, h)
					if err != nil {
						t.Fatal(err)
					}
					if !slices.Equal(pairs[k].IDs, want.IDs) || !slices.Equal(pairs[k].TypeIDs, want.TypeIDs) {
						t.Fatalf("pair %d (%q × %q) is not the joined encoding", k, sent, h)
					}
					k++
				}
			}
		}
	}
	if k != len(pairs) {
		t.Fatalf("%d pairs sent, %d expected", len(pairs), k)
	}

	s := newSession(t, joined)
	score := func(m *model.Model) []float32 {
		ts, err := NewTranscriptScorer(m, lc, s)
		if err != nil {
			t.Fatal(err)
		}
		out, err := ts.Score(t.Context(), events[:1])
		if err != nil {
			t.Fatal(err)
		}
		if want := string(m.PairEncoding); out[0].PairEncoding != want {
			t.Errorf("pair_encoding %q, want %q", out[0].PairEncoding, want)
		}
		var all []float32
		for _, sec := range events[0].SectionNames() {
			all = append(all, out[0].Sections[sec].Results[lc.Labels[1]].Scores...)
		}
		return all
	}
	a, b := score(plain), score(joined)
	moved := 0
	for i := range a {
		if math.Abs(float64(a[i]-b[i])) > 1e-3 {
			moved++
		}
	}
	if moved == 0 {
		t.Errorf("pair and joined scores agree within 1e-3 on all %d sentences: %v vs %v", len(a), a, b)
	}
	t.Logf("pair vs joined on %s: %d of %d scores moved by more than 1e-3 (first: %.4f vs %.4f)", joined.Name, moved, len(a), a[0], b[0])
}

// TestJoinedHypothesisRoom: under joined encoding a separator and
// hypothesis that leave no premise room are refused up front, naming both.
func TestJoinedHypothesisRoom(t *testing.T) {
	// A small tokenizer: the refusal is the same for every model.
	short := sharedLoad(t, model.LoadOptions{Dir: testenv.ModelDir(t, "nli-wordpiece-small"), MaxLength: 12, PairEncoding: model.EncodeJoined})
	lc := DefaultLabelConfig()
	lc.Labels = []string{"reduced consumer's spending patterns"}
	if _, err := NewTranscriptScorer(short, lc, &fakeScorer{}); err == nil || !strings.Contains(err.Error(), "separator and hypothesis") {
		t.Errorf("separator + hypothesis over max length: %v", err)
	}
}
