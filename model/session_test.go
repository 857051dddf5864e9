package model

import (
	ort "github.com/yalue/onnxruntime_go"

	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/scorer/scorer/internal/testenv"
)

// goldenCase is one reference pair computed by the reference stack (HF
// tokenizers + PyTorch/ORT in Python) for model/testdata/golden/<model>.json.
type goldenCase struct {
	Premise      string    `json:"premise"`
	Hypothesis   string    `json:"hypothesis"`
	PremiseIDs   []int32   `json:"premise_ids"`
	InputIDs     []int32   `json:"input_ids"`
	TokenTypeIDs []int32   `json:"token_type_ids"`
	Logits       []float64 `json:"logits"`
	Probs        []float64 `json:"probs"`
}

// goldenFile is model/testdata/golden/<model>.json: the reference stack's
// view of the model next to its cases.
type goldenFile struct {
	MaxLength  int          `json:"max_length"`
	InputNames []string     `json:"input_names"`
	Cases      []goldenCase `json:"cases"`
}

// readGolden reads a golden file, failing clearly when it is missing.
func readGolden(t *testing.T, name string) goldenFile {
	t.Helper()
	path := filepath.Join("testdata", "golden", name+".json")
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("golden file for %s missing (%v): the tokenizer's golden generator writes it; without it the model's numerics are unchecked", name, err)
	}
	var g goldenFile
	if err := json.Unmarshal(data, &g); err != nil {
		t.Fatalf("parsing %s: %v", path, err)
	}
	if len(g.Cases) == 0 {
		t.Fatalf("%s has no cases", path)
	}
	return g
}

// TestGoldenScores feeds the reference input ids straight to the session, so
// a mismatch here is in graph I/O, padding or score math, not tokenization.
// Under -short every model but the production architecture is checked on
// every 16th case and the longest (their graph I/O, labels and score math,
// across the lengths); make test checks every case of every model.
func TestGoldenScores(t *testing.T) {
	for _, dir := range testenv.ModelDirs(t) {
		name := filepath.Base(dir)
		t.Run(name, func(t *testing.T) {
			m := sharedModel(t, dir)
			s := newSession(t, m)
			g := readGolden(t, name)
			cases := g.Cases
			if testing.Short() && name != testenv.ProductionArch {
				cases = shortGoldenCases(cases)
				t.Logf("-short: %d of the %d cases (every 16th and the longest); make test checks them all", len(cases), len(g.Cases))
			}
			if g.MaxLength != m.MaxLength || !slices.Equal(g.InputNames, m.InputNames) {
				t.Errorf("golden max_length %d inputs %v; Load found %d %v", g.MaxLength, g.InputNames, m.MaxLength, m.InputNames)
			}
			pairs := make([]Pair, len(cases))
			for i, c := range cases {
				if len(c.Logits) != len(m.ID2Label) || len(c.Probs) != len(m.ID2Label) {
					t.Fatalf("case %d: %d logits, %d probs for %d labels", i, len(c.Logits), len(c.Probs), len(m.ID2Label))
				}
				pairs[i] = Pair{IDs: c.InputIDs, TypeIDs: c.TokenTypeIDs}
			}
			// Golden values were computed pair by pair; batches keep
			// padding in play.
			logits, probs := scoreSortedBatches(t, s, m, pairs)
			var maxLogit, maxProb float64
			golden := make([]float64, len(cases))
			for i, c := range cases {
				for k := range c.Logits {
					d := math.Abs(float64(logits[i][k]) - c.Logits[k])
					maxLogit = math.Max(maxLogit, d)
					if d > 1e-4 {
						t.Errorf("case %d (%q / %q): logit[%d] = %v, golden %v", i, c.Premise, c.Hypothesis, k, logits[i][k], c.Logits[k])
					}
				}
				golden[i] = c.Probs[m.EntailmentIndex]
				d := math.Abs(float64(probs[i]) - golden[i])
				maxProb = math.Max(maxProb, d)
				if d > 1e-4 {
					t.Errorf("case %d (%q / %q): P(entailment) = %v, golden %v", i, c.Premise, c.Hypothesis, probs[i], golden[i])
				}
			}
			// These small models never reach the production threshold, so
			// decisions are compared at a threshold inside the golden
			// distribution, midway between two neighbours so no golden value
			// sits on it.
			sorted := slices.Clone(golden)
			slices.Sort(sorted)
			mid := len(sorted) / 2
			thr := sorted[mid]
			if mid > 0 {
				thr = (sorted[mid-1] + sorted[mid]) / 2
			}
			flips := 0
			for i := range golden {
				if (float64(probs[i]) > thr) != (golden[i] > thr) {
					flips++
					t.Errorf("case %d: decision at %v differs: ours %v, golden %v", i, thr, probs[i], golden[i])
				}
			}
			t.Logf("%s: %d cases, max |Δlogit| %.3g, max |ΔP(entail)| %.3g, decision flips at %.4f: %d", name, len(cases), maxLogit, maxProb, thr, flips)
		})
	}
}

// shortIndices are the -short sample of pairs: every 16th (the golden
// sets are in no length order, so these span the lengths) and the longest.
func shortIndices(pairs []Pair) []int {
	var out []int
	longest := 0
	for i, p := range pairs {
		if len(p.IDs) > len(pairs[longest].IDs) {
			longest = i
		}
		if i%16 == 0 {
			out = append(out, i)
		}
	}
	if longest%16 != 0 {
		out = append(out, longest)
	}
	return out
}

// shortGoldenCases is shortIndices' sample of golden cases.
func shortGoldenCases(cases []goldenCase) []goldenCase {
	pairs := make([]Pair, len(cases))
	for i, c := range cases {
		pairs[i] = Pair{IDs: c.InputIDs}
	}
	var out []goldenCase
	for _, i := range shortIndices(pairs) {
		out = append(out, cases[i])
	}
	return out
}

// realPairs encodes a few real sentences against a hypothesis with the
// model's own tokenizer.
func realPairs(t testing.TB, m *Model, sentences ...string) []Pair {
	t.Helper()
	hyp, err := m.Tokenizer.Encode("This text is about consumer weakness.")
	if err != nil {
		t.Fatal(err)
	}
	out := make([]Pair, len(sentences))
	for i, s := range sentences {
		ids, err := m.Tokenizer.Encode(s)
		if err != nil {
			t.Fatal(err)
		}
		out[i] = m.Tokenizer.EncodePair(ids, hyp, m.MaxLength)
	}
	return out
}

var sampleSentences = []string{
	"Consumers pulled back sharply on discretionary purchases this quarter.",
	"Revenue grew 12%.",
	"We saw strong demand across all of our retail channels, with traffic up double digits and average ticket higher than a year ago, which gives us confidence in the outlook.",
	"Thank you.",
	"Inventory levels remain elevated as shoppers trade down to private label and delay big-ticket items, and we expect that pressure to persist through the holiday season and into the first half of next year.",
}

func TestBatchInvariance(t *testing.T) {
	for _, dir := range testenv.ModelDirs(t) {
		t.Run(filepath.Base(dir), func(t *testing.T) {
			m := sharedModel(t, dir)
			s := newSession(t, m)
			pairs := realPairs(t, m, sampleSentences...)
			batch, err := s.ScorePairs(t.Context(), pairs)
			if err != nil {
				t.Fatal(err)
			}
			batchLogits, err := s.Logits(t.Context(), pairs)
			if err != nil {
				t.Fatal(err)
			}
			padded := false
			for i, p := range pairs {
				alone, err := s.ScorePairs(t.Context(), []Pair{p})
				if err != nil {
					t.Fatal(err)
				}
				if d := math.Abs(float64(alone[0] - batch[i])); d > 1e-4 {
					t.Errorf("pair %d (%d tokens): alone %v, in batch %v (Δ %.3g)", i, len(p.IDs), alone[0], batch[i], d)
				}
				for _, q := range pairs {
					padded = padded || len(q.IDs) > len(p.IDs)
				}
				// ScorePairs must be exactly the softmax read of Logits.
				want := entailmentProb(batchLogits[i], m.ScoreMode, m.EntailmentIndex, m.ContradictionIndex)
				if batch[i] != want {
					t.Errorf("pair %d: ScorePairs %v != softmax(Logits)[entail] %v", i, batch[i], want)
				}
				if batch[i] < 0 || batch[i] > 1 || math.IsNaN(float64(batch[i])) {
					t.Errorf("pair %d: score %v is not a probability", i, batch[i])
				}
			}
			if !padded {
				t.Fatal("sample pairs all have the same length; the test would not exercise padding")
			}
		})
	}
}

// TestScoreModes: entail_vs_contradiction is the two-way softmax of the
// entailment and contradiction logits, on every model (under -short the
// production architecture and nli-unigram-small, whose contradiction label
// is not_entailment; make test runs every model). The models are shared
// (sharedLoad) with TestScoreCacheKeySeparation.
func TestScoreModes(t *testing.T) {
	for _, dir := range testenv.ModelDirs(t) {
		if name := filepath.Base(dir); testing.Short() && name != testenv.ProductionArch && name != "nli-unigram-small" {
			t.Logf("-short: %s skipped; make test runs every model", name)
			continue
		}
		t.Run(filepath.Base(dir), func(t *testing.T) {
			m := sharedLoad(t, LoadOptions{Dir: dir, ScoreMode: ScoreEntailVsContradiction})
			if m.ScoreMode != ScoreEntailVsContradiction {
				t.Fatalf("ScoreMode %q", m.ScoreMode)
			}
			s := newSession(t, m)
			pairs := realPairs(t, m, sampleSentences...)
			logits, err := s.Logits(t.Context(), pairs)
			if err != nil {
				t.Fatal(err)
			}
			got, err := s.ScorePairs(t.Context(), pairs)
			if err != nil {
				t.Fatal(err)
			}
			for i, row := range logits {
				e, c := float64(row[m.EntailmentIndex]), float64(row[m.ContradictionIndex])
				want := 1 / (1 + math.Exp(c-e))
				if math.Abs(float64(got[i])-want) > 1e-6 {
					t.Errorf("pair %d: entail_vs_contradiction %v, want %v from logits %v", i, got[i], want, row)
				}
			}
		})
	}
}

// TestSessionConcurrent: concurrent Runs on one session give each batch
// the scores it gets alone, on every model (under -short the production
// architecture; make test runs every model).
func TestSessionConcurrent(t *testing.T) {
	for _, dir := range testenv.ModelDirs(t) {
		if name := filepath.Base(dir); testing.Short() && name != testenv.ProductionArch {
			t.Logf("-short: %s skipped, the production architecture checked; make test runs every model", name)
			continue
		}
		t.Run(filepath.Base(dir), func(t *testing.T) {
			m := sharedModel(t, dir)
			// Concurrent Runs share one intra-op pool; with spinning on,
			// idle workers burn the test machine's two cores and the test
			// crawls (onnxruntime_go #47).
			s, err := m.NewSession(SessionOptions{IntraOpThreads: 2, Configure: func(o *ort.SessionOptions) error {
				return o.AddSessionConfigEntry("session.intra_op.allow_spinning", "0")
			}})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Close() })
			pairs := realPairs(t, m, sampleSentences...)
			want, err := s.ScorePairs(t.Context(), pairs)
			if err != nil {
				t.Fatal(err)
			}
			const workers, rounds = 4, 3
			var wg sync.WaitGroup
			errs := make(chan error, workers*rounds)
			for w := range workers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for r := range rounds {
						// Each goroutine scores a different rotation so
						// batches differ in shape and order.
						k := (w + r) % len(pairs)
						batch := append(slices.Clone(pairs[k:]), pairs[:k]...)
						got, err := s.ScorePairs(t.Context(), batch)
						if err != nil {
							errs <- err
							return
						}
						for i := range got {
							if d := math.Abs(float64(got[i] - want[(i+k)%len(pairs)])); d > 1e-4 {
								errs <- fmt.Errorf("worker %d round %d pair %d: %v vs %v", w, r, i, got[i], want[(i+k)%len(pairs)])
								return
							}
						}
					}
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Error(err)
			}
		})
	}
}

// longPairs is a batch big enough that Run takes seconds on a small CPU.
func longPairs(m *Model, rows int) []Pair {
	pairs := make([]Pair, rows)
	for r := range pairs {
		ids := make([]int32, m.MaxLength)
		types := make([]int32, m.MaxLength)
		for j := range ids {
			ids[j] = int32(100 + (r*31+j*7)%5000)
		}
		pairs[r] = Pair{IDs: ids, TypeIDs: types}
	}
	return pairs
}

// TestSessionCancel: cancelling a Run mid-way (RunOptions' Terminate), a
// deadline and a done context all return at once, and the session scores
// after them. Its session has the default options (plainSession, spinning
// on), as before the other tests' sessions stopped spinning: its bound is
// a time.
func TestSessionCancel(t *testing.T) {
	m := sharedModel(t, testenv.ModelDir(t, testenv.ProductionArch))
	s := plainSession(t, m)
	pairs := longPairs(m, 128)

	t.Run("cancel mid-run", func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		time.AfterFunc(300*time.Millisecond, cancel)
		start := time.Now()
		_, err := s.ScorePairs(ctx, pairs)
		elapsed := time.Since(start)
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("ScorePairs after cancel = %v, want context.Canceled", err)
		}
		// A full 128×512 run takes over 4 s on the 2-core test machine;
		// returning soon after the cancel shows Terminate reached ORT
		// rather than the call waiting for Run to finish.
		if elapsed > 2*time.Second {
			t.Errorf("ScorePairs returned %v after start, %v after cancel", elapsed, elapsed-300*time.Millisecond)
		}
		t.Logf("returned %v after start", elapsed)
	})
	t.Run("deadline", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
		defer cancel()
		if _, err := s.ScorePairs(ctx, pairs); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("ScorePairs past deadline = %v, want context.DeadlineExceeded", err)
		}
	})
	t.Run("already cancelled", func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		if _, err := s.ScorePairs(ctx, pairs[:1]); !errors.Is(err, context.Canceled) {
			t.Fatalf("ScorePairs with a done ctx = %v, want context.Canceled", err)
		}
	})
	t.Run("session still usable", func(t *testing.T) {
		got, err := s.ScorePairs(t.Context(), realPairs(t, m, sampleSentences[:2]...))
		if err != nil || len(got) != 2 {
			t.Fatalf("ScorePairs after cancellations = %v, %v", got, err)
		}
	})
}

func TestSessionInputErrors(t *testing.T) {
	m := sharedModel(t, testenv.ModelDir(t, "nli-wordpiece-small"))
	s := newSession(t, m)

	got, err := s.ScorePairs(t.Context(), nil)
	if err != nil || got == nil || len(got) != 0 {
		t.Errorf("ScorePairs(nil) = %#v, %v; want an empty, non-nil slice", got, err)
	}
	tooLong := make([]int32, m.MaxLength+1)
	tests := []struct {
		name string
		pair Pair
	}{
		{"empty pair", Pair{}},
		{"type ids length", Pair{IDs: []int32{1, 2, 3}, TypeIDs: []int32{0}}},
		{"too long", Pair{IDs: tooLong}},
	}
	for _, tc := range tests {
		if _, err := s.ScorePairs(t.Context(), []Pair{{IDs: []int32{1, 2}}, tc.pair}); err == nil {
			t.Errorf("%s: ScorePairs succeeded", tc.name)
		} else if !strings.HasPrefix(err.Error(), "model: ") || !errors.Is(err, ErrInvalidInput) {
			t.Errorf("%s: error %q: want the model: prefix and ErrInvalidInput", tc.name, err)
		}
	}
}

func TestSessionClose(t *testing.T) {
	m := sharedModel(t, testenv.ModelDir(t, testenv.ProductionArch))
	s, err := m.NewSession(SessionOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Errorf("second Close = %v, want nil", err)
	}
	if _, err := s.ScorePairs(t.Context(), realPairs(t, m, "x")); !errors.Is(err, ErrSessionClosed) {
		t.Errorf("ScorePairs after Close = %v, want ErrSessionClosed", err)
	}
}

func TestNewSessionOptions(t *testing.T) {
	m := sharedModel(t, testenv.ModelDir(t, testenv.ProductionArch))
	if _, err := m.NewSession(SessionOptions{IntraOpThreads: -1}); err == nil {
		t.Error("negative thread count accepted")
	}
	boom := errors.New("no such provider")
	_, err := m.NewSession(SessionOptions{Configure: func(*ort.SessionOptions) error { return boom }})
	if !errors.Is(err, boom) {
		t.Errorf("Configure error = %v, want it wrapped", err)
	}
	called := false
	s, err := m.NewSession(SessionOptions{IntraOpThreads: 1, Configure: func(*ort.SessionOptions) error { called = true; return nil }})
	if err != nil || !called {
		t.Fatalf("NewSession with Configure = %v (called %v)", err, called)
	}
	s.Close()
}

// TestReleaseArenaAndMemPattern runs the options gpupool gives CUDA sessions
// on the CPU: memory patterns off, ReleaseArena's shrinkage run (with the
// CPU arena as its target here) and ScorePairsReleasingArena all leave
// scores unchanged, and a session without ShrinkArenas says it cannot
// shrink.
func TestReleaseArenaAndMemPattern(t *testing.T) {
	m := sharedModel(t, testenv.ModelDir(t, testenv.ProductionArch))
	plain := newSession(t, m)
	s, err := m.NewSession(SessionOptions{IntraOpThreads: 1, DisableMemPattern: true, ShrinkArenas: "cpu:0"})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	pairs := realPairs(t, m, sampleSentences...)
	want, err := plain.ScorePairs(t.Context(), pairs)
	if err != nil {
		t.Fatal(err)
	}
	for round := range 2 {
		got, err := s.ScorePairs(t.Context(), pairs)
		if err != nil {
			t.Fatal(err)
		}
		for i := range want {
			if d := math.Abs(float64(got[i] - want[i])); d > 1e-5 {
				t.Errorf("round %d pair %d: %v, plain session %v", round, i, got[i], want[i])
			}
		}
		if err := s.ReleaseArena(t.Context()); err != nil {
			t.Fatalf("ReleaseArena: %v", err)
		}
		got, err = s.ScorePairsReleasingArena(t.Context(), pairs)
		if err != nil {
			t.Fatalf("ScorePairsReleasingArena: %v", err)
		}
		for i := range want {
			if d := math.Abs(float64(got[i] - want[i])); d > 1e-5 {
				t.Errorf("round %d pair %d, releasing the arena: %v, plain session %v", round, i, got[i], want[i])
			}
		}
	}
	if err := plain.ReleaseArena(t.Context()); !errors.Is(err, ErrNoArenaShrink) {
		t.Errorf("ReleaseArena without ShrinkArenas = %v, want ErrNoArenaShrink", err)
	}
	if _, err := plain.ScorePairsReleasingArena(t.Context(), pairs); !errors.Is(err, ErrNoArenaShrink) {
		t.Errorf("ScorePairsReleasingArena without ShrinkArenas = %v, want ErrNoArenaShrink", err)
	}
}

// plainSession is newSession with the default options but the thread
// counts (spinning on): what the memory key is about, and what
// TestSessionCancel times.
func plainSession(t *testing.T, m *Model) *Session {
	t.Helper()
	return openSession(t, m, SessionOptions{IntraOpThreads: 2, InterOpThreads: 1})
}

// TestMemoryKey: a session's memory key names the model's version and the
// options its memory depends on, and is empty where it cannot say (a model
// still loading, options set by Configure that ConfigureKey does not name).
// On nli-wordpiece-small, whose Start (the model still loading) costs a
// quarter of DeBERTa's: the key is built the same way for every model.
func TestMemoryKey(t *testing.T) {
	dir := testenv.ModelDir(t, "nli-wordpiece-small")
	m := sharedModel(t, dir)
	one, err := m.NewSession(SessionOptions{IntraOpThreads: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer one.Close()
	two := plainSession(t, m)
	k1, k2 := one.MemoryKey(), two.MemoryKey()
	if !strings.Contains(k1, m.SHA256) || !strings.Contains(k1, ort.GetVersion()) || k1 == k2 {
		t.Errorf("keys %q (1 thread) and %q (2 threads): want the model's SHA-256 and ORT's version in each, and different keys", k1, k2)
	}
	conf, err := m.NewSession(SessionOptions{IntraOpThreads: 1, Configure: func(*ort.SessionOptions) error { return nil }})
	if err != nil {
		t.Fatal(err)
	}
	defer conf.Close()
	if k := conf.MemoryKey(); k != "" {
		t.Errorf("key of a session with Configure: %q, want none", k)
	}
	named, err := m.NewSession(SessionOptions{IntraOpThreads: 1, Configure: func(*ort.SessionOptions) error { return nil },
		ConfigureKey: "cuda use_tf32=1"})
	if err != nil {
		t.Fatal(err)
	}
	defer named.Close()
	if k := named.MemoryKey(); !strings.HasPrefix(k, k1+" ") || !strings.Contains(k, "use_tf32=1") || !strings.Contains(k, fmt.Sprint("output=", m.OutputType)) {
		t.Errorf("key of a session with Configure and ConfigureKey: %q, want %q, the output type and the configure key", k, k1)
	}
	ld, err := Start(LoadOptions{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	early := plainSession(t, ld.Model())
	if k := early.MemoryKey(); k != "" {
		t.Errorf("key of a session on a model still loading: %q, want none", k)
	}
	if _, err := ld.Wait(); err != nil {
		t.Fatal(err)
	}
	if k := early.MemoryKey(); k != k2 {
		t.Errorf("key once loaded: %q, want %q", k, k2)
	}
}
