package model

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/scorer/scorer/internal/testenv"
)

// TestTinyModelReferences: for the repository's tiny byte-level BPE models
// (tools/tiny-models), each pair of torch-logits.json encodes to HF
// tokenizers' ids in both pair encodings, and one batch of every pair (mixed
// lengths and, for BART, </s> counts) gives the torch module's logits within
// 1e-4 with the same argmax. cmd/scorer's TestTinyBPEModels* hold `scorer
// score` and `scorer run` to the same file.
func TestTinyModelReferences(t *testing.T) {
	for _, name := range []string{"nli-roberta-bpe-tiny", "nli-bart-bpe-tiny"} {
		dir := testenv.ModelDir(t, name)
		var ref struct {
			Sentences  []string                 `json:"sentences"`
			Hypotheses []string                 `json:"hypotheses"`
			Separator  string                   `json:"pair_separator"`
			IDs        map[string][][][]int32   `json:"ids"`
			Logits     map[string][][][]float32 `json:"logits"`
		}
		data, err := os.ReadFile(filepath.Join(dir, "torch-logits.json"))
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(data, &ref); err != nil {
			t.Fatal(err)
		}
		for _, enc := range []PairEncoding{EncodePair, EncodeJoined} {
			t.Run(name+"/"+string(enc), func(t *testing.T) {
				m := sharedLoad(t, LoadOptions{Dir: dir, PairEncoding: enc, PairSeparator: ref.Separator})
				var pairs []Pair
				var want [][]float32
				for si, s := range ref.Sentences {
					for hi, h := range ref.Hypotheses {
						p, err := m.EncodeText(s, h)
						if err != nil {
							t.Fatal(err)
						}
						if w := ref.IDs[string(enc)][si][hi]; !slices.Equal(p.IDs, w) {
							t.Errorf("sentence %d %.50q, hypothesis %d: ids %v, HF %v", si, s, hi, p.IDs, w)
						}
						pairs = append(pairs, p)
						want = append(want, ref.Logits[string(enc)][si][hi])
					}
				}
				got, err := newSession(t, m).Logits(t.Context(), pairs)
				if err != nil {
					t.Fatal(err)
				}
				for i := range want {
					for k := range want[i] {
						if math.Abs(float64(got[i][k]-want[i][k])) > 1e-4 {
							t.Errorf("pair %d: logits %v, torch %v", i, got[i], want[i])
							break
						}
					}
					if argmax(got[i]) != argmax(want[i]) {
						t.Errorf("pair %d: argmax %d, torch %d", i, argmax(got[i]), argmax(want[i]))
					}
				}
			})
		}
	}
}

func argmax(v []float32) int {
	best := 0
	for i := range v {
		if v[i] > v[best] {
			best = i
		}
	}
	return best
}
