package fanout

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/scorer/scorer/internal/testenv"
	"github.com/scorer/scorer/model"
	"github.com/scorer/scorer/schema"
)

// fakeScorer records every call and scores pair i as a fixed function of i,
// so the test can tell exactly which score landed where.
type fakeScorer struct {
	mu    sync.Mutex
	calls [][]model.Pair
	err   error
	short bool // return one score too few
}

func fakeScore(i int) float32 { return float32(i%20) / 20 }

func (f *fakeScorer) ScorePairs(_ context.Context, pairs []model.Pair) ([]float32, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, pairs)
	if f.err != nil {
		return nil, f.err
	}
	out := make([]float32, len(pairs))
	for i := range out {
		out[i] = fakeScore(i)
	}
	if f.short {
		out = out[1:]
	}
	return out, nil
}

// countingEncoder wraps the model's tokenizer to count Encode calls; fail
// makes one sentence's tokenization fail.
func countingEncoder(n *atomic.Int64, fail string) ScorerOption {
	return withEncoder(func(m *model.Model) func(string) ([]int32, error) {
		return func(s string) ([]int32, error) {
			n.Add(1)
			if s == fail {
				return nil, errors.New("cannot tokenize")
			}
			return m.Tokenizer.Encode(s)
		}
	})
}

func TestLabelConfigValidate(t *testing.T) {
	if err := DefaultLabelConfig().Validate(); err != nil {
		t.Fatalf("default config invalid: %v", err)
	}
	d := DefaultLabelConfig()
	if d.Template != "This text is about {}." || d.Threshold != 0.91 ||
		!slices.Equal(d.Labels, []string{"consumer strength", "consumer weakness", "reduced consumer's spending patterns"}) {
		t.Errorf("DefaultLabelConfig() = %+v", d)
	}
	if h := d.Hypotheses(); h[1] != "This text is about consumer weakness." {
		t.Errorf("Hypotheses()[1] = %q", h[1])
	}
	tests := []struct {
		name string
		lc   LabelConfig
		want string
	}{
		{"no slot", LabelConfig{Template: "This text is about it.", Labels: []string{"a"}, Threshold: 0.5}, "exactly one {}"},
		{"two slots", LabelConfig{Template: "{} and {}", Labels: []string{"a"}, Threshold: 0.5}, "exactly one {}"},
		{"no labels", LabelConfig{Template: "{}", Threshold: 0.5}, "no labels"},
		{"blank label", LabelConfig{Template: "{}", Labels: []string{"a", " "}, Threshold: 0.5}, "label 1 is empty"},
		{"duplicate label", LabelConfig{Template: "{}", Labels: []string{"a", "a"}, Threshold: 0.5}, `"a" appears twice`},
		{"threshold above 1", LabelConfig{Template: "{}", Labels: []string{"a"}, Threshold: 1.5}, "outside [0, 1]"},
		{"threshold NaN", LabelConfig{Template: "{}", Labels: []string{"a"}, Threshold: math.NaN()}, "outside [0, 1]"},
	}
	for _, tc := range tests {
		err := tc.lc.Validate()
		if err == nil || !strings.HasPrefix(err.Error(), "fanout: ") || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: Validate() = %v, want fanout: error with %q", tc.name, err, tc.want)
		}
	}
}

func TestNewTranscriptScorerErrors(t *testing.T) {
	m := sharedLoad(t, model.LoadOptions{Dir: testenv.ModelDir(t, testenv.ProductionArch)})
	if _, err := NewTranscriptScorer(nil, DefaultLabelConfig(), &fakeScorer{}); err == nil {
		t.Error("nil model accepted")
	}
	if _, err := NewTranscriptScorer(m, DefaultLabelConfig(), nil); err == nil {
		t.Error("nil engine accepted")
	}
	bad := DefaultLabelConfig()
	bad.Template = "no slot"
	if _, err := NewTranscriptScorer(m, bad, &fakeScorer{}); err == nil || !strings.Contains(err.Error(), "{}") {
		t.Errorf("bad template: %v", err)
	}
	// A small tokenizer: the refusal is the same for every model.
	short := sharedLoad(t, model.LoadOptions{Dir: testenv.ModelDir(t, "nli-wordpiece-small"), MaxLength: 8})
	long := DefaultLabelConfig()
	long.Labels = []string{"reduced consumer's spending patterns across every region and channel"}
	if _, err := NewTranscriptScorer(short, long, &fakeScorer{}); err == nil || !strings.Contains(err.Error(), "no room") {
		t.Errorf("hypothesis longer than max length: %v", err)
	}
}

func TestTranscriptScorerFake(t *testing.T) {
	m := sharedLoad(t, model.LoadOptions{Dir: testenv.ModelDir(t, testenv.ProductionArch)})
	events := testenv.FirstTranscripts(t, 3, 1<<30)
	// An empty section must still appear, with empty (not null) lists.
	events[1].Sections["FILT_EMPTY"] = []string{}

	lc := DefaultLabelConfig()
	lc.Threshold = 0.5
	var encodes atomic.Int64
	fake := &fakeScorer{}
	at := time.Date(2024, 5, 6, 7, 8, 9, 0, time.FixedZone("EST", -5*3600))
	ts, err := NewTranscriptScorer(m, lc, fake, WithClock(func() time.Time { return at }), countingEncoder(&encodes, ""))
	if err != nil {
		t.Fatal(err)
	}
	L := len(lc.Labels)
	if got := encodes.Load(); got != int64(L) {
		t.Errorf("NewTranscriptScorer made %d tokenizer calls, want %d (one per hypothesis)", got, L)
	}
	encodes.Store(0)

	out, err := ts.Score(t.Context(), events)
	if err != nil {
		t.Fatal(err)
	}
	N, wantPairs := 0, 0
	for i := range events {
		N += events[i].SentenceCount()
		wantPairs += ts.PairCount(&events[i])
	}
	if got := encodes.Load(); got != int64(N) {
		t.Errorf("Score made %d tokenizer calls for %d sentences, want one each", got, N)
	}
	if got := ts.Encoded(); got != uint64(N) {
		t.Errorf("Encoded() = %d after tokenizing %d sentences", got, N)
	}
	if len(fake.calls) != 1 {
		t.Fatalf("engine called %d times, want once for the whole slice", len(fake.calls))
	}
	pairs := fake.calls[0]
	if len(pairs) != wantPairs || wantPairs != N*L {
		t.Fatalf("engine got %d pairs, want %d = %d sentences × %d labels", len(pairs), wantPairs, N, L)
	}

	hyps := make([][]int32, L)
	for l, h := range lc.Hypotheses() {
		hyps[l], _ = m.Tokenizer.Encode(h)
	}
	if len(out) != len(events) {
		t.Fatalf("%d results for %d events", len(out), len(events))
	}
	next := 0
	for i, ev := range events {
		st := out[i]
		if st.CallID != ev.CallID || st.EntityID != ev.EntityID || st.CompanyName != ev.CompanyName || st.EventTime != ev.EventTime || st.VersionID != ev.VersionID || st.CallName != ev.CallName {
			t.Errorf("event %d identity not copied: %+v", i, st)
		}
		if st.Model != m.Info() || st.HypothesisTemplate != lc.Template || st.ScoreMode != "softmax" || st.Threshold != 0.5 || !slices.Equal(st.Labels, lc.Labels) {
			t.Errorf("event %d scoring metadata: %+v", i, st)
		}
		if st.ScoredAt != "2024-05-06T12:08:09Z" {
			t.Errorf("ScoredAt = %q, want the injected clock in UTC", st.ScoredAt)
		}
		if len(st.Sections) != len(ev.Sections) {
			t.Errorf("event %d: %d sections, want %d", i, len(st.Sections), len(ev.Sections))
		}
		for _, sec := range ev.SectionNames() {
			sents := ev.Sections[sec]
			sr, ok := st.Sections[sec]
			if !ok || sr.Sentences != len(sents) || len(sr.Results) != L {
				t.Fatalf("event %d section %s: %+v", i, sec, sr)
			}
			if !slices.Equal(sr.Text, sents) {
				t.Errorf("event %d section %s: Text does not carry the section's sentences", i, sec)
			}
			for l, label := range lc.Labels {
				lr := sr.Results[label]
				if lr.Scores == nil || lr.Flags == nil || lr.Matches == nil {
					t.Errorf("event %d %s %s: nil slice in %+v", i, sec, label, lr)
				}
				var matches []string
				for j, sent := range sents {
					k := next + j*L + l
					// The pair at k must be this sentence against this
					// label's hypothesis.
					ids, _ := m.Tokenizer.Encode(sent)
					want := m.Tokenizer.EncodePair(ids, hyps[l], m.MaxLength)
					if !slices.Equal(pairs[k].IDs, want.IDs) || !slices.Equal(pairs[k].TypeIDs, want.TypeIDs) {
						t.Fatalf("event %d %s sentence %d label %d: pair %d is not that sentence × hypothesis", i, sec, j, l, k)
					}
					if lr.Scores[j] != fakeScore(k) {
						t.Errorf("event %d %s sentence %d label %s: score %v, want %v", i, sec, j, label, lr.Scores[j], fakeScore(k))
					}
					flag := 0
					if float64(fakeScore(k)) > lc.Threshold {
						flag = 1
						matches = append(matches, sent)
					}
					if lr.Flags[j] != flag {
						t.Errorf("event %d %s sentence %d label %s: flag %d, want %d", i, sec, j, label, lr.Flags[j], flag)
					}
				}
				if !slices.Equal(lr.Matches, matches) {
					t.Errorf("event %d %s %s: matches %q, want %q", i, sec, label, lr.Matches, matches)
				}
			}
			next += len(sents) * L
		}
	}
	// JSON shape of the empty section: lists, never null.
	data, err := json.Marshal(out[1].Sections["FILT_EMPTY"])
	if err != nil {
		t.Fatal(err)
	}
	if want := `"consumer weakness":{"scores":[],"flags":[],"matches":[]}`; !strings.Contains(string(data), want) || !strings.Contains(string(data), `"sentences":0`) {
		t.Errorf("empty section JSON = %s", data)
	}
}

func TestTranscriptScorerErrors(t *testing.T) {
	m := sharedLoad(t, model.LoadOptions{Dir: testenv.ModelDir(t, testenv.ProductionArch)})
	events := testenv.FirstTranscripts(t, 2, 5)
	sec := events[1].SectionNames()[0]
	bad := "This sentence appears nowhere else in the corpus."
	events[1].Sections[sec] = slices.Clone(events[1].Sections[sec])
	events[1].Sections[sec][3] = bad

	var n atomic.Int64
	ts, err := NewTranscriptScorer(m, DefaultLabelConfig(), &fakeScorer{}, countingEncoder(&n, bad))
	if err != nil {
		t.Fatal(err)
	}
	_, err = ts.Score(t.Context(), events)
	for _, want := range []string{events[1].CallID, sec, "sentence 3", "cannot tokenize"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("tokenizer failure: err = %v, want it to name %q", err, want)
		}
	}

	engineErr := errors.New("device lost")
	ts, _ = NewTranscriptScorer(m, DefaultLabelConfig(), &fakeScorer{err: engineErr})
	if _, err := ts.Score(t.Context(), events); !errors.Is(err, engineErr) {
		t.Errorf("engine failure: err = %v, want it wrapped", err)
	}
	ts, _ = NewTranscriptScorer(m, DefaultLabelConfig(), &fakeScorer{short: true})
	if _, err := ts.Score(t.Context(), events); err == nil || !strings.Contains(err.Error(), "scores for") {
		t.Errorf("short engine result: err = %v", err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	fake := &fakeScorer{}
	ts, _ = NewTranscriptScorer(m, DefaultLabelConfig(), fake)
	if _, err := ts.Score(ctx, events); !errors.Is(err, context.Canceled) || len(fake.calls) != 0 {
		t.Errorf("cancelled ctx: err = %v, engine calls %d", err, len(fake.calls))
	}
	// No events, or only empty sections: no engine call, empty output.
	fake = &fakeScorer{}
	ts, _ = NewTranscriptScorer(m, DefaultLabelConfig(), fake)
	out, err := ts.Score(t.Context(), []schema.TranscriptEvent{{CallID: "x", Sections: map[string][]string{"FILT_MD": {}}}})
	if err != nil || len(out) != 1 || out[0].Sections["FILT_MD"].Sentences != 0 || len(fake.calls) != 0 {
		t.Errorf("empty event: %+v, %v, %d engine calls", out, err, len(fake.calls))
	}
}

// TestTranscriptScorerReal runs real transcripts through the real model and
// checks each score against scoring that pair directly, on every model
// (under -short the production architecture; make test runs every model).
func TestTranscriptScorerReal(t *testing.T) {
	for _, dir := range testenv.ModelDirs(t) {
		if name := dir[strings.LastIndex(dir, "/")+1:]; testing.Short() && name != testenv.ProductionArch {
			t.Logf("-short: %s skipped, the production architecture checked; make test runs every model", name)
			continue
		}
		t.Run(dir[strings.LastIndex(dir, "/")+1:], func(t *testing.T) {
			m := sharedLoad(t, model.LoadOptions{Dir: dir})
			s := newSession(t, m)
			events := testenv.FirstTranscripts(t, 2, 4)
			lc := DefaultLabelConfig()
			ts, err := NewTranscriptScorer(m, lc, s)
			if err != nil {
				t.Fatal(err)
			}
			out, err := ts.Score(t.Context(), events)
			if err != nil {
				t.Fatal(err)
			}
			ev, st := events[0], out[0]
			sec := ev.SectionNames()[0]
			sent := ev.Sections[sec][2]
			ids, _ := m.Tokenizer.Encode(sent)
			for l, h := range lc.Hypotheses() {
				hid, _ := m.Tokenizer.Encode(h)
				direct, err := s.ScorePairs(t.Context(), []model.Pair{m.Tokenizer.EncodePair(ids, hid, m.MaxLength)})
				if err != nil {
					t.Fatal(err)
				}
				got := st.Sections[sec].Results[lc.Labels[l]].Scores[2]
				if math.Abs(float64(got-direct[0])) > 1e-4 {
					t.Errorf("%s sentence 2 label %q: transcript score %v, direct %v", sec, lc.Labels[l], got, direct[0])
				}
			}
			for _, st := range out {
				if st.Model.SHA256 != m.SHA256 || st.Model.Name != m.Name {
					t.Errorf("model info %+v", st.Model)
				}
				for sec, sr := range st.Sections {
					for label, lr := range sr.Results {
						for j, v := range lr.Scores {
							if !(v >= 0 && v <= 1) {
								t.Errorf("%s %s %s[%d] = %v", st.CallID, sec, label, j, v)
							}
						}
					}
				}
			}
		})
	}
}
