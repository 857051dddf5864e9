package model

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/scorer/scorer/internal/testenv"
)

const tinyBART = "nli-bart-bpe-tiny"

// TestEOSHeadMixedCounts: a BART-style head reads each row's last </s>
// through a reshape to [batch, -1, d], so a batch whose rows hold different
// numbers of </s> (a premise with a literal "</s>", which the tokenizer reads
// as the token) failed in ONNX Runtime before eosRows split it:
//
//	model: running 4×26 batch: ... Reshape node ... The input tensor cannot be reshaped to the requested shape
//
// Each row must score as it does alone.
func TestEOSHeadMixedCounts(t *testing.T) {
	m := sharedModel(t, testenv.ModelDir(t, tinyBART))
	s := newSession(t, m)
	pairs := realPairs(t, m,
		"They wrote </s> in the transcript.",
		"Revenue grew 12%.",
		"Two </s> here </s> and more text after them.",
		"Margins were flat.",
	)
	counts := map[int]bool{}
	for _, p := range pairs {
		n := 0
		for _, id := range p.IDs {
			if id == m.eosHead {
				n++
			}
		}
		counts[n] = true
	}
	if len(counts) != 3 {
		t.Fatalf("rows hold </s> counts %v, want three different ones", counts)
	}
	batch, err := s.Logits(t.Context(), pairs)
	if err != nil {
		t.Fatal(err)
	}
	for i, p := range pairs {
		alone, err := s.Logits(t.Context(), []Pair{p})
		if err != nil {
			t.Fatal(err)
		}
		for k := range alone[0] {
			if d := math.Abs(float64(alone[0][k] - batch[i][k])); d > 1e-5 {
				t.Errorf("pair %d logit %d: alone %v, in batch %v", i, k, alone[0], batch[i])
				break
			}
		}
	}
}

// TestEOSHeadSyntheticRows: calibration's rows of one repeated token and the
// arena release's single pad hold no </s>; the head's Gather failed on them
// and `scorer score` stopped at start:
//
//	gpupool: cpu: calibration warm-up: model: running 1×8 batch: ... Gather ... idx=-1 must be within the inclusive range [0,-1]
func TestEOSHeadSyntheticRows(t *testing.T) {
	m := sharedModel(t, testenv.ModelDir(t, tinyBART))
	s := openSession(t, m, SessionOptions{IntraOpThreads: 1, InterOpThreads: 1, ShrinkArenas: "cpu:0"})
	pad := m.Tokenizer.PadID()
	rows := []Pair{{IDs: []int32{pad, pad, pad, pad, pad, pad, pad, pad}}, {IDs: []int32{pad, pad, pad, pad, pad, pad, pad, pad}}}
	got, err := s.ScorePairs(t.Context(), rows)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || math.IsNaN(float64(got[0])) {
		t.Fatalf("scores %v", got)
	}
	if err := s.ReleaseArena(t.Context()); err != nil {
		t.Fatal(err)
	}
	if rows[0].IDs[7] != pad {
		t.Error("the caller's row was modified")
	}
}

// TestEOSHeadRefused: a BART classifier whose config has no eos_token_id, or
// whose tokenizer puts no </s> in a pair, cannot be fed safely and is
// refused at load with what is missing.
func TestEOSHeadRefused(t *testing.T) {
	src := testenv.ModelDir(t, tinyBART)
	copyDir := func(t *testing.T) string {
		dir := filepath.Join(t.TempDir(), tinyBART)
		for _, f := range []string{"config.json", "tokenizer.json", "tokenizer_config.json", "onnx/model.onnx"} {
			data, err := os.ReadFile(filepath.Join(src, f))
			if err != nil {
				t.Fatal(err)
			}
			if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, f)), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, f), data, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		return dir
	}
	edit := func(t *testing.T, path string, change func(map[string]any)) {
		var v map[string]any
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(data, &v); err != nil {
			t.Fatal(err)
		}
		change(v)
		if data, err = json.Marshal(v); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	t.Run("no eos_token_id", func(t *testing.T) {
		dir := copyDir(t)
		edit(t, filepath.Join(dir, "config.json"), func(v map[string]any) { delete(v, "eos_token_id") })
		_, err := Load(LoadOptions{Dir: dir})
		if err == nil || !strings.Contains(err.Error(), "BartForSequenceClassification reads the last eos token") {
			t.Fatalf("Load: %v", err)
		}
	})
	t.Run("no eos in a pair", func(t *testing.T) {
		dir := copyDir(t)
		edit(t, filepath.Join(dir, "tokenizer.json"), func(v map[string]any) { v["post_processor"] = nil })
		_, err := Load(LoadOptions{Dir: dir})
		if err == nil || !strings.Contains(err.Error(), "the tokenizer's pair encoding of a pair has none") {
			t.Fatalf("Load: %v", err)
		}
	})
	t.Run("other architectures", func(t *testing.T) {
		// RoBERTa's head reads <s>: no eos rule, batches run as given.
		m := sharedModel(t, testenv.ModelDir(t, "nli-roberta-bpe-tiny"))
		pairs := realPairs(t, m, "They wrote </s> in the transcript.", "Revenue grew.")
		if got, groups := m.eosRows(pairs); groups != nil || &got[0] != &pairs[0] {
			t.Errorf("eosRows changed a RoBERTa batch: groups %v", groups)
		}
	})
}
