package model

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/scorer/scorer/internal/testenv"
)

// joinedGolden is model/testdata/golden/<model>.joined.json: HF tokenizers'
// single-sequence encode of premise+separator+hypothesis (the premise cut as
// tokenizer.EncodeJoined documents) and onnxruntime-node's logits for it.
type joinedGolden struct {
	MaxLength int    `json:"max_length"`
	Encoding  string `json:"pair_encoding"`
	Cases     []struct {
		goldenCase
		Separator string `json:"separator"`
	} `json:"cases"`
}

// TestGoldenJoined is PAIR_ENCODING=joined end to end against the
// independent reference: the model's own encoding (Load with EncodeJoined
// and the case's separator, then EncodeText) must give the reference ids
// exactly, and the session's logits and P(entailment) must be within 1e-4.
// The case's separator is passed to Load, except the default one
// ("</s></s>"), which is left to Load to pick (and then checked against the
// case's): that model is the one the other joined tests share (sharedLoad).
// Under -short every case's ids are checked, and the logits of every 16th
// case and the longest; make test checks every case's logits.
func TestGoldenJoined(t *testing.T) {
	for _, dir := range testenv.ModelDirs(t) {
		name := filepath.Base(dir)
		if testing.Short() && name != testenv.ProductionArch {
			t.Logf("-short: %s skipped, only the production architecture checked (a model loaded per separator); make test checks every shared model", name)
			continue
		}
		t.Run(name, func(t *testing.T) {
			data, err := os.ReadFile(filepath.Join("testdata", "golden", name+".joined.json"))
			if err != nil {
				t.Fatalf("joined golden file for %s missing (run `make golden`): %v", name, err)
			}
			var g joinedGolden
			if err := json.Unmarshal(data, &g); err != nil {
				t.Fatal(err)
			}
			if len(g.Cases) == 0 || g.Encoding != "joined" {
				t.Fatalf("%s: %d cases, encoding %q", name, len(g.Cases), g.Encoding)
			}
			models := map[string]*Model{}
			var s *Session
			pairs := make([]Pair, len(g.Cases))
			for i, c := range g.Cases {
				m := models[c.Separator]
				if m == nil {
					opts := LoadOptions{Dir: dir, PairEncoding: EncodeJoined, PairSeparator: c.Separator}
					if c.Separator == DefaultPairSeparator {
						opts.PairSeparator = ""
					}
					m = sharedLoad(t, opts)
					if m.MaxLength != g.MaxLength || m.PairSeparator != c.Separator {
						t.Fatalf("Load: max length %d separator %q; golden %d %q", m.MaxLength, m.PairSeparator, g.MaxLength, c.Separator)
					}
					models[c.Separator] = m
					if s == nil {
						s = newSession(t, m)
					}
				}
				p, err := m.EncodeText(c.Premise, c.Hypothesis)
				if err != nil {
					t.Fatalf("case %d: %v", i, err)
				}
				if !slices.Equal(p.IDs, c.InputIDs) || !slices.Equal(p.TypeIDs, c.TokenTypeIDs) {
					t.Fatalf("case %d (%q %q %q): ids\n got %v\nwant %v", i, c.Premise, c.Separator, c.Hypothesis, p.IDs, c.InputIDs)
				}
				pairs[i] = p
			}
			m := models[g.Cases[0].Separator]
			scored := make([]int, len(pairs))
			for i := range scored {
				scored[i] = i
			}
			if testing.Short() {
				scored = shortIndices(pairs)
				t.Logf("-short: the logits of %d of the %d cases (every 16th and the longest); make test checks them all", len(scored), len(pairs))
			}
			batch := make([]Pair, len(scored))
			for k, i := range scored {
				batch[k] = pairs[i]
			}
			logits, probs := scoreSortedBatches(t, s, m, batch)
			var maxLogit, maxProb float64
			for k, i := range scored {
				c := g.Cases[i]
				for j := range c.Logits {
					d := math.Abs(float64(logits[k][j]) - c.Logits[j])
					maxLogit = math.Max(maxLogit, d)
					if d > 1e-4 {
						t.Errorf("case %d (%q): logit[%d] = %v, reference %v", i, c.Premise, j, logits[k][j], c.Logits[j])
					}
				}
				d := math.Abs(float64(probs[k]) - c.Probs[m.EntailmentIndex])
				maxProb = math.Max(maxProb, d)
				if d > 1e-4 {
					t.Errorf("case %d (%q): P(entailment) = %v, reference %v", i, c.Premise, probs[k], c.Probs[m.EntailmentIndex])
				}
			}
			t.Logf("%s joined: %d cases, %d separators, max |Δlogit| %.3g, max |ΔP(entail)| %.3g", name, len(g.Cases), len(models), maxLogit, maxProb)
		})
	}
}

// scoreSortedBatches scores pairs 16 at a time in length order (padding in
// play, as in service, without padding 1000 rows to 512) and returns each
// pair's logits and P(entailment) in input order.
func scoreSortedBatches(t *testing.T, s *Session, m *Model, pairs []Pair) ([][]float32, []float32) {
	t.Helper()
	order := make([]int, len(pairs))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return len(pairs[a].IDs) - len(pairs[b].IDs) })
	logits := make([][]float32, len(pairs))
	probs := make([]float32, len(pairs))
	for start := 0; start < len(order); start += 16 {
		idx := order[start:min(start+16, len(order))]
		batch := make([]Pair, len(idx))
		for k, i := range idx {
			batch[k] = pairs[i]
		}
		rows, err := s.Logits(t.Context(), batch)
		if err != nil {
			t.Fatal(err)
		}
		for k, i := range idx {
			logits[i] = rows[k]
			probs[i] = entailmentProb(rows[k], m.ScoreMode, m.EntailmentIndex, m.ContradictionIndex)
		}
	}
	return logits, probs
}

func TestPairEncodingOptions(t *testing.T) {
	// A small tokenizer: the refusal is the same for every model.
	dir := testenv.ModelDir(t, "nli-wordpiece-small")
	if _, err := Load(LoadOptions{Dir: dir, PairEncoding: "concatenated"}); err == nil || !strings.Contains(err.Error(), `unknown pair encoding "concatenated"`) {
		t.Errorf("bad encoding: %v", err)
	}
	if e, err := ParsePairEncoding(""); err != nil || e != EncodePair {
		t.Errorf(`ParsePairEncoding("") = %q, %v`, e, err)
	}
}
