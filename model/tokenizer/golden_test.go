package tokenizer

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/scorer/scorer/internal/testenv"
)

type goldenFile struct {
	Model     string `json:"model"`
	MaxLength int    `json:"max_length"`
	Cases     []struct {
		Premise      string  `json:"premise"`
		Hypothesis   string  `json:"hypothesis"`
		PremiseIDs   []int32 `json:"premise_ids"`
		InputIDs     []int32 `json:"input_ids"`
		TokenTypeIDs []int32 `json:"token_type_ids"`
	} `json:"cases"`
}

// TestGolden compares every case of every golden file (written by
// tools/golden/generate.mjs from HF tokenizers itself) id for id, for every
// tokenizer under shared/models. A folder with only a tokenizer (no model to
// score, so no golden file of its own) is checked against the golden file of
// a model folder whose tokenizer.json has the same bytes.
func TestGolden(t *testing.T) {
	goldenDir := filepath.Join(testenv.RepoRoot(), "model", "testdata", "golden")
	byTokenizer := map[string]string{} // tokenizer.json SHA-256 → golden file
	for _, dir := range testenv.ModelDirs(t) {
		byTokenizer[testenv.SHA256File(t, filepath.Join(dir, "tokenizer.json"))] = filepath.Join(goldenDir, filepath.Base(dir)+".json")
	}
	for _, dir := range testenv.TokenizerDirs(t) {
		name := filepath.Base(dir)
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(goldenDir, name+".json")
			hint := "run `make golden`"
			if _, err := os.Stat(filepath.Join(dir, "config.json")); err != nil {
				hint = "a tokenizer-only folder is covered by the golden file of a model folder with the same tokenizer.json; tools/golden writes files for model folders only"
				if shared, ok := byTokenizer[testenv.SHA256File(t, filepath.Join(dir, "tokenizer.json"))]; ok {
					path = shared
				}
			}
			data, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("golden file for %s missing (%s): %v", name, hint, err)
			}
			var g goldenFile
			if err := json.Unmarshal(data, &g); err != nil {
				t.Fatal(err)
			}
			if len(g.Cases) == 0 || g.MaxLength <= 0 {
				t.Fatalf("golden file for %s has %d cases, max_length %d", name, len(g.Cases), g.MaxLength)
			}
			tok := loadDir(t, dir)
			pass, fails := 0, 0
			for i, c := range g.Cases {
				p, err := tok.Encode(c.Premise)
				if err != nil {
					t.Fatalf("case %d: Encode(%q): %v", i, c.Premise, err)
				}
				h, err := tok.Encode(c.Hypothesis)
				if err != nil {
					t.Fatalf("case %d: Encode(%q): %v", i, c.Hypothesis, err)
				}
				pair := tok.EncodePair(p, h, g.MaxLength)
				ok := true
				if !slices.Equal(p, c.PremiseIDs) {
					ok = false
					t.Errorf("case %d premise %q:\n got %v\nwant %v", i, c.Premise, p, c.PremiseIDs)
				}
				if !slices.Equal(pair.IDs, c.InputIDs) || !slices.Equal(pair.TypeIDs, c.TokenTypeIDs) {
					ok = false
					t.Errorf("case %d pair (%q, %q):\n got %v %v\nwant %v %v", i, c.Premise, c.Hypothesis, pair.IDs, pair.TypeIDs, c.InputIDs, c.TokenTypeIDs)
				}
				if ok {
					pass++
				} else if fails++; fails > 20 {
					t.Fatalf("too many failures")
				}
			}
			t.Logf("%s: %d/%d golden cases of %s pass", name, pass, len(g.Cases), filepath.Base(path))
		})
	}
}

type joinedGoldenFile struct {
	Model     string `json:"model"`
	MaxLength int    `json:"max_length"`
	Encoding  string `json:"pair_encoding"`
	Cases     []struct {
		Premise      string  `json:"premise"`
		Separator    string  `json:"separator"`
		Hypothesis   string  `json:"hypothesis"`
		Kept         *int    `json:"premise_chars_kept"`
		InputIDs     []int32 `json:"input_ids"`
		TokenTypeIDs []int32 `json:"token_type_ids"`
	} `json:"cases"`
}

// TestGoldenJoined compares EncodeJoined with HF's single-sequence encode
// of premise+separator+hypothesis (and, over max length, with the same
// premise cut replayed on HF's tokenizer) id for id.
func TestGoldenJoined(t *testing.T) {
	for _, dir := range testenv.ModelDirs(t) {
		name := filepath.Base(dir)
		t.Run(name, func(t *testing.T) {
			data, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "model", "testdata", "golden", name+".joined.json"))
			if err != nil {
				t.Fatalf("joined golden file for %s missing (run `make golden`): %v", name, err)
			}
			var g joinedGoldenFile
			if err := json.Unmarshal(data, &g); err != nil {
				t.Fatal(err)
			}
			if len(g.Cases) == 0 || g.MaxLength <= 0 || g.Encoding != "joined" {
				t.Fatalf("joined golden file for %s: %d cases, max_length %d, encoding %q", name, len(g.Cases), g.MaxLength, g.Encoding)
			}
			tok := loadDir(t, dir)
			pass, cut, fails := 0, 0, 0
			for i, c := range g.Cases {
				p, err := tok.EncodeJoined(c.Premise, c.Separator, c.Hypothesis, g.MaxLength)
				if err != nil {
					t.Fatalf("case %d: EncodeJoined: %v", i, err)
				}
				if c.Kept != nil {
					cut++
				}
				if slices.Equal(p.IDs, c.InputIDs) && slices.Equal(p.TypeIDs, c.TokenTypeIDs) {
					pass++
					continue
				}
				t.Errorf("case %d (%q + %q + %q, premise kept %v):\n got %v %v\nwant %v %v", i, c.Premise, c.Separator, c.Hypothesis, c.Kept, p.IDs, p.TypeIDs, c.InputIDs, c.TokenTypeIDs)
				if fails++; fails > 20 {
					t.Fatalf("too many failures")
				}
			}
			if cut == 0 {
				t.Errorf("no case cuts the premise: the truncation search is untested")
			}
			t.Logf("%s: %d/%d joined golden cases pass (%d with the premise cut)", name, pass, len(g.Cases), cut)
		})
	}
}
