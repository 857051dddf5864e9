package fanout

import (
	"context"
	"math"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/scorer/scorer/internal/fanout/scorecache"
	"github.com/scorer/scorer/internal/testenv"
	"github.com/scorer/scorer/model"
	"github.com/scorer/scorer/schema"
)

// countingEngine passes pairs to a real session and counts them, so a test
// sees how many pairs reached inference.
type countingEngine struct {
	s     PairScorer
	pairs atomic.Int64
}

func (c *countingEngine) ScorePairs(ctx context.Context, pairs []model.Pair) ([]float32, error) {
	c.pairs.Add(int64(len(pairs)))
	return c.s.ScorePairs(ctx, pairs)
}

// sameExceptScores compares two outputs field by field, scores within tol.
func sameExceptScores(t *testing.T, what string, got, want []schema.ScoredTranscript, tol float64) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d transcripts, want %d", what, len(got), len(want))
	}
	for i := range want {
		g, w := got[i], want[i]
		if g.CallID != w.CallID || g.Model != w.Model || g.ScoreMode != w.ScoreMode || g.ScoredAt != w.ScoredAt ||
			g.Threshold != w.Threshold || strings.Join(g.Labels, "|") != strings.Join(w.Labels, "|") || len(g.Sections) != len(w.Sections) {
			t.Fatalf("%s: transcript %d header differs:\n got %+v\nwant %+v", what, i, g, w)
		}
		for sec, ws := range w.Sections {
			gs := g.Sections[sec]
			if gs.Sentences != ws.Sentences || strings.Join(gs.Text, "\n") != strings.Join(ws.Text, "\n") {
				t.Fatalf("%s: %s %s differs", what, w.CallID, sec)
			}
			for label, wl := range ws.Results {
				gl := gs.Results[label]
				if strings.Join(gl.Matches, "\n") != strings.Join(wl.Matches, "\n") || len(gl.Scores) != len(wl.Scores) {
					t.Fatalf("%s: %s %s %q matches %q, want %q", what, w.CallID, sec, label, gl.Matches, wl.Matches)
				}
				for j := range wl.Scores {
					if d := math.Abs(float64(gl.Scores[j] - wl.Scores[j])); d > tol || gl.Flags[j] != wl.Flags[j] {
						t.Fatalf("%s: %s %s %q[%d]: %v (flag %d), want %v (flag %d)", what, w.CallID, sec, label, j,
							gl.Scores[j], gl.Flags[j], wl.Scores[j], wl.Flags[j])
					}
				}
			}
		}
	}
}

// revise edits every 10th sentence of each section, as a corrected
// transcript would.
func revise(events []schema.TranscriptEvent) (out []schema.TranscriptEvent, edited int) {
	for _, ev := range events {
		ev.VersionID = ev.VersionID + "-rev"
		secs := make(map[string][]string, len(ev.Sections))
		for name, sents := range ev.Sections {
			s := append([]string(nil), sents...)
			for j := 0; j < len(s); j += 10 {
				s[j] = strings.TrimSuffix(s[j], ".") + ", as corrected."
				edited++
			}
			secs[name] = s
		}
		ev.Sections = secs
		out = append(out, ev)
	}
	return out, edited
}

// TestScoreCacheReal scores real transcripts with the real model, cache on
// and off: the same output (scores within 1e-5), a repeat costs no
// inference, a revision costs only its edited sentences, and every hit
// equals the freshly computed score; on every model folder (under -short
// the production architecture: the cache is keyed and filled the same way
// for every model; make test runs every folder).
func TestScoreCacheReal(t *testing.T) {
	for _, dir := range testenv.ModelDirs(t) {
		if name := filepath.Base(dir); testing.Short() && name != testenv.ProductionArch {
			t.Logf("-short: %s skipped, the production architecture checked; make test runs every model folder", name)
			continue
		}
		t.Run(filepath.Base(dir), func(t *testing.T) { scoreCacheReal(t, dir) })
	}
}

// scoreCacheReal is TestScoreCacheReal on one model folder.
func scoreCacheReal(t *testing.T, dir string) {
	m := sharedLoad(t, model.LoadOptions{Dir: dir})
	s := newSession(t, m)
	events := testenv.FirstTranscripts(t, 3, 12)
	lc := DefaultLabelConfig()
	L := len(lc.Labels)
	clock := WithClock(func() time.Time { return time.Unix(1700000000, 0) })
	total := 0
	for i := range events {
		total += events[i].SentenceCount() * L
	}

	off, err := NewTranscriptScorer(m, lc, s, clock)
	if err != nil {
		t.Fatal(err)
	}
	want, err := off.Score(t.Context(), events)
	if err != nil {
		t.Fatal(err)
	}

	cache, err := scorecache.New(8<<20, nil)
	if err != nil {
		t.Fatal(err)
	}
	eng := &countingEngine{s: s}
	on, err := NewTranscriptScorer(m, lc, eng, clock, WithCache(cache))
	if err != nil {
		t.Fatal(err)
	}
	got, err := on.Score(t.Context(), events)
	if err != nil {
		t.Fatal(err)
	}
	sameExceptScores(t, "cache on, first pass", got, want, 1e-5)
	unique := eng.pairs.Load()
	if unique == 0 || unique > int64(total) {
		t.Fatalf("first pass inferred %d of %d pairs", unique, total)
	}
	if st := cache.Stats(); st.Entries != unique || st.Hits != 0 {
		t.Errorf("after the first pass: %+v; want %d entries, no hits", st, unique)
	}

	// A repeat: every pair is a hit, output as before.
	eng.pairs.Store(0)
	again, err := on.Score(t.Context(), events)
	if err != nil {
		t.Fatal(err)
	}
	if n := eng.pairs.Load(); n != 0 {
		t.Errorf("a repeat inferred %d pairs, want 0", n)
	}
	sameExceptScores(t, "cache on, repeat", again, got, 0)
	sameExceptScores(t, "cache on, repeat vs off", again, want, 1e-5)

	// A revision: only the edited sentences reach the engine, and the
	// output equals scoring the revision from scratch.
	rev, edited := revise(events)
	eng.pairs.Store(0)
	gotRev, err := on.Score(t.Context(), rev)
	if err != nil {
		t.Fatal(err)
	}
	if n := eng.pairs.Load(); n == 0 || n > int64(edited*L) {
		t.Errorf("the revision inferred %d pairs; want 1..%d (edited sentences × labels)", n, edited*L)
	}
	wantRev, err := off.Score(t.Context(), rev)
	if err != nil {
		t.Fatal(err)
	}
	sameExceptScores(t, "revision", gotRev, wantRev, 1e-5)

	// Within one call, a repeated transcript is inferred once.
	cache2, _ := scorecache.New(8<<20, nil)
	eng2 := &countingEngine{s: s}
	on2, _ := NewTranscriptScorer(m, lc, eng2, clock, WithCache(cache2))
	twice, err := on2.Score(t.Context(), []schema.TranscriptEvent{events[0], events[0]})
	if err != nil {
		t.Fatal(err)
	}
	sameExceptScores(t, "one call, same transcript twice", twice, []schema.ScoredTranscript{want[0], want[0]}, 1e-5)
	if n, max := eng2.pairs.Load(), int64(events[0].SentenceCount()*L); n > max {
		t.Errorf("a transcript twice in one call inferred %d pairs, want at most %d", n, max)
	}
}

// TestScoreCacheKeySeparation shares one cache between scorers that must
// not answer for each other: another hypothesis template, another score
// mode, another model, another pair encoding or separator. Each scores
// everything afresh. Its models are shared (sharedLoad), and each gets one
// session, counted per case. Two sentences a section: a case is all hits
// or all misses, which a few pairs show as well as many.
func TestScoreCacheKeySeparation(t *testing.T) {
	events := testenv.FirstTranscripts(t, 1, 2)
	lc := DefaultLabelConfig()
	pairs := int64(events[0].SentenceCount() * len(lc.Labels))
	cache, err := scorecache.New(4<<20, nil)
	if err != nil {
		t.Fatal(err)
	}
	uni := sharedLoad(t, model.LoadOptions{Dir: testenv.ModelDir(t, "nli-unigram-small")})
	evc := sharedLoad(t, model.LoadOptions{Dir: testenv.ModelDir(t, "nli-unigram-small"), ScoreMode: model.ScoreEntailVsContradiction})
	wp := sharedLoad(t, model.LoadOptions{Dir: testenv.ModelDir(t, "nli-wordpiece-small")})
	wpJoined := sharedLoad(t, model.LoadOptions{Dir: testenv.ModelDir(t, "nli-wordpiece-small"), PairEncoding: model.EncodeJoined})
	// BERT's pre-tokenizer drops the spaces, so these ids equal wpJoined's:
	// only the separator in the key tells the two apart.
	wpSpaced := sharedLoad(t, model.LoadOptions{Dir: testenv.ModelDir(t, "nli-wordpiece-small"), PairEncoding: model.EncodeJoined, PairSeparator: " </s></s> "})
	sent, hyp := events[0].Sections[events[0].SectionNames()[0]][0], lc.Hypotheses()[0]
	a, _ := wpJoined.EncodeText(sent, hyp)
	b, _ := wpSpaced.EncodeText(sent, hyp)
	if !slices.Equal(a.IDs, b.IDs) || !slices.Equal(a.TypeIDs, b.TypeIDs) {
		t.Fatalf("separators %q and %q give different ids on %s; the test needs equal ones", wpJoined.PairSeparator, wpSpaced.PairSeparator, wp.Name)
	}
	deb := sharedLoad(t, model.LoadOptions{Dir: testenv.ModelDir(t, testenv.ProductionArch)})
	other := lc
	other.Template = "The topic is {}."
	other.Threshold = 0.5
	cases := []struct {
		name string
		m    *model.Model
		lc   LabelConfig
		hit  bool
	}{
		{"first", uni, lc, false},
		{"same again", uni, lc, true},
		{"threshold only differs", uni, LabelConfig{Template: lc.Template, Labels: lc.Labels, Threshold: 0.2}, true},
		{"other template", uni, other, false},
		{"other score mode", evc, lc, false},
		{"other model", wp, lc, false},
		{"joined encoding", wpJoined, lc, false},
		{"joined again", wpJoined, lc, true},
		{"other separator, same ids", wpSpaced, lc, false},
		{"other architecture", deb, lc, false},
	}
	sessions := map[*model.Model]*model.Session{}
	for _, c := range cases {
		if sessions[c.m] == nil {
			sessions[c.m] = newSession(t, c.m)
		}
		eng := &countingEngine{s: sessions[c.m]}
		ts, err := NewTranscriptScorer(c.m, c.lc, eng, WithCache(cache))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := ts.Score(t.Context(), events); err != nil {
			t.Fatal(err)
		}
		if n := eng.pairs.Load(); c.hit != (n == 0) || (!c.hit && n > pairs) {
			t.Errorf("%s: %d of %d pairs inferred; want all hits = %v", c.name, n, pairs, c.hit)
		}
	}
}
