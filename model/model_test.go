package model

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/scorer/scorer/internal/testenv"
)

// copyModelDir makes a throwaway model folder from a real one: every file is
// symlinked (the graphs are tens of MB) except config.json, which is decoded,
// passed to edit and rewritten. skip names files to leave out.
func copyModelDir(t *testing.T, src string, edit func(cfg map[string]any), skip ...string) string {
	t.Helper()
	dst := t.TempDir()
	entries, err := os.ReadDir(src)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		name := e.Name()
		if name == "config.json" || e.IsDir() || contains(skip, name) {
			continue
		}
		if err := os.Symlink(filepath.Join(src, name), filepath.Join(dst, name)); err != nil {
			t.Fatal(err)
		}
	}
	if contains(skip, "config.json") {
		return dst
	}
	data, err := os.ReadFile(filepath.Join(src, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	var cfg map[string]any
	if err := json.Unmarshal(data, &cfg); err != nil {
		t.Fatal(err)
	}
	if edit != nil {
		edit(cfg)
	}
	out, _ := json.Marshal(cfg)
	if err := os.WriteFile(filepath.Join(dst, "config.json"), out, 0o644); err != nil {
		t.Fatal(err)
	}
	return dst
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// TestLoadRealModels loads every shared model and checks what Load derives
// against config.json and the file itself, not against per-folder constants.
// The loads are the shared ones (sharedModel: Load with default options,
// once per process), which the other tests score with.
func TestLoadRealModels(t *testing.T) {
	for _, dir := range testenv.ModelDirs(t) {
		t.Run(filepath.Base(dir), func(t *testing.T) {
			m := sharedModel(t, dir)
			if m.Name != filepath.Base(dir) {
				t.Errorf("Name = %q, want %q", m.Name, filepath.Base(dir))
			}
			// model.onnx at the top, else onnx/model.onnx (the export layout
			// of the repository's tiny models).
			wantONNX := filepath.Join(dir, "model.onnx")
			if _, err := os.Stat(wantONNX); err != nil {
				wantONNX = filepath.Join(dir, "onnx", "model.onnx")
			}
			if m.ONNXPath != wantONNX {
				t.Errorf("ONNXPath = %q, want %q", m.ONNXPath, wantONNX)
			}
			rel, _ := filepath.Rel(dir, m.ONNXPath)
			if want := testenv.ModelVersion(t, dir, rel); m.SHA256 != want {
				t.Errorf("SHA256 = %s, want %s", m.SHA256, want)
			}
			if info := m.Info(); info.Name != m.Name || info.SHA256 != m.SHA256 {
				t.Errorf("Info() = %+v", info)
			}
			var cfg struct {
				ID2Label map[string]string `json:"id2label"`
			}
			data, _ := os.ReadFile(filepath.Join(dir, "config.json"))
			if err := json.Unmarshal(data, &cfg); err != nil {
				t.Fatal(err)
			}
			if len(m.ID2Label) != len(cfg.ID2Label) {
				t.Fatalf("ID2Label = %v, config has %v", m.ID2Label, cfg.ID2Label)
			}
			for k, v := range cfg.ID2Label {
				if got := m.ID2Label[k[0]-'0']; got != v {
					t.Errorf("ID2Label[%s] = %q, want %q", k, got, v)
				}
			}
			if l := strings.ToLower(m.ID2Label[m.EntailmentIndex]); !strings.HasPrefix(l, "entail") {
				t.Errorf("EntailmentIndex %d is label %q", m.EntailmentIndex, l)
			}
			if m.ContradictionIndex < 0 || m.ContradictionIndex == m.EntailmentIndex {
				t.Errorf("ContradictionIndex = %d (labels %v)", m.ContradictionIndex, m.ID2Label)
			}
			if m.ScoreMode != ScoreSoftmax {
				t.Errorf("ScoreMode = %q, want default softmax", m.ScoreMode)
			}
			if m.MaxLength != 512 {
				t.Errorf("MaxLength = %d, want 512 (min of model_max_length, max_position_embeddings, 512)", m.MaxLength)
			}
			if m.OutputName != "logits" {
				t.Errorf("OutputName = %q", m.OutputName)
			}
			if !contains(m.InputNames, "input_ids") || !contains(m.InputNames, "attention_mask") {
				t.Errorf("InputNames = %v", m.InputNames)
			}
		})
	}
	// The folders differ in exactly the ways Load must discover: only the
	// BERT WordPiece graph takes token_type_ids (DeBERTa-v3 has
	// type_vocab_size 0), and the contradiction label's name.
	uni := sharedModel(t, testenv.ModelDir(t, "nli-unigram-small"))
	wp := sharedModel(t, testenv.ModelDir(t, "nli-wordpiece-small"))
	deb := sharedModel(t, testenv.ModelDir(t, testenv.ProductionArch))
	if contains(uni.InputNames, "token_type_ids") || !contains(wp.InputNames, "token_type_ids") || contains(deb.InputNames, "token_type_ids") {
		t.Errorf("token_type_ids: unigram inputs %v, wordpiece inputs %v, deberta inputs %v", uni.InputNames, wp.InputNames, deb.InputNames)
	}
	if uni.ID2Label[uni.ContradictionIndex] != "not_entailment" || wp.ID2Label[wp.ContradictionIndex] != "contradiction" {
		t.Errorf("contradiction labels: %q, %q", uni.ID2Label[uni.ContradictionIndex], wp.ID2Label[wp.ContradictionIndex])
	}
}

func TestLoadOptions(t *testing.T) {
	dir := testenv.ModelDir(t, "nli-wordpiece-small")
	two := 2
	m := loadModel(t, LoadOptions{Dir: dir, EntailmentIndex: &two, ContradictionIndex: new(int), ScoreMode: ScoreEntailVsContradiction, MaxLength: 128})
	if m.EntailmentIndex != 2 || m.ContradictionIndex != 0 || m.ScoreMode != ScoreEntailVsContradiction || m.MaxLength != 128 {
		t.Errorf("overrides not applied: entail %d contra %d mode %s max %d", m.EntailmentIndex, m.ContradictionIndex, m.ScoreMode, m.MaxLength)
	}

	// Unnamed labels load once the index is given.
	unnamed := copyModelDir(t, dir, func(cfg map[string]any) {
		cfg["id2label"] = map[string]string{"0": "LABEL_0", "1": "LABEL_1", "2": "LABEL_2"}
	})
	one := 1
	if m := loadModel(t, LoadOptions{Dir: unnamed, EntailmentIndex: &one}); m.EntailmentIndex != 1 {
		t.Errorf("EntailmentIndex = %d, want override 1", m.EntailmentIndex)
	}

	// model.onnx absent: the single onnx/model*.onnx is used; two are
	// ambiguous and the error lists them; ONNXFile picks one.
	sub := copyModelDir(t, dir, nil, "model.onnx")
	if err := os.Mkdir(filepath.Join(sub, "onnx"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(dir, "model.onnx"), filepath.Join(sub, "onnx", "model_fp32.onnx")); err != nil {
		t.Fatal(err)
	}
	if m := loadModel(t, LoadOptions{Dir: sub}); m.ONNXPath != filepath.Join(sub, "onnx", "model_fp32.onnx") {
		t.Errorf("ONNXPath = %q, want the single onnx/model*.onnx", m.ONNXPath)
	}
	if err := os.Symlink(filepath.Join(dir, "model.onnx"), filepath.Join(sub, "onnx", "model_quantized.onnx")); err != nil {
		t.Fatal(err)
	}
	_, err := Load(LoadOptions{Dir: sub})
	if err == nil || !strings.Contains(err.Error(), "onnx/model_fp32.onnx") || !strings.Contains(err.Error(), "onnx/model_quantized.onnx") {
		t.Errorf("ambiguous ONNX files: err = %v, want both candidates listed", err)
	}
	if m := loadModel(t, LoadOptions{Dir: sub, ONNXFile: "onnx/model_quantized.onnx"}); m.ONNXPath != filepath.Join(sub, "onnx", "model_quantized.onnx") {
		t.Errorf("ONNXPath = %q, want the chosen file", m.ONNXPath)
	}
}

func TestLoadErrors(t *testing.T) {
	wp := testenv.ModelDir(t, "nli-wordpiece-small")
	uni := testenv.ModelDir(t, "nli-unigram-small")
	five, minus := 5, -1

	malformed := copyModelDir(t, wp, nil)
	if err := os.WriteFile(filepath.Join(malformed, "config.json"), []byte(`{"id2label": {"0": "entailment",`), 0o644); err != nil {
		t.Fatal(err)
	}
	noEntail := copyModelDir(t, wp, func(cfg map[string]any) {
		cfg["id2label"] = map[string]string{"0": "LABEL_0", "1": "LABEL_1", "2": "LABEL_2"}
	})
	gappy := copyModelDir(t, wp, func(cfg map[string]any) {
		cfg["id2label"] = map[string]string{"0": "contradiction", "1": "entailment", "5": "neutral"}
	})
	noLabels := copyModelDir(t, wp, func(cfg map[string]any) { delete(cfg, "id2label") })
	twoLabelsNoContra := copyModelDir(t, uni, func(cfg map[string]any) {
		cfg["id2label"] = map[string]string{"0": "entailment", "1": "other"}
	})
	noONNX := copyModelDir(t, wp, nil, "model.onnx")
	outside, err := filepath.Rel(noONNX, filepath.Join(wp, "model.onnx"))
	if err != nil {
		t.Fatal(err)
	}
	noTokenizer := copyModelDir(t, wp, nil, "tokenizer.json")
	noConfig := copyModelDir(t, wp, nil, "config.json")

	extraInput := copyModelDir(t, wp, nil, "model.onnx")
	writeTinyONNX(t, filepath.Join(extraInput, "model.onnx"),
		[]fakeIO{{"input_ids", onnxInt64, []any{"batch", "seq"}}, {"attention_mask", onnxInt64, []any{"batch", "seq"}}, {"position_ids", onnxInt64, []any{"batch", "seq"}}},
		[]fakeIO{{"logits", onnxFloat, []any{"batch", 3}}})
	noMask := copyModelDir(t, wp, nil, "model.onnx")
	writeTinyONNX(t, filepath.Join(noMask, "model.onnx"),
		[]fakeIO{{"input_ids", onnxInt64, []any{"batch", "seq"}}},
		[]fakeIO{{"logits", onnxFloat, []any{"batch", 3}}})
	wrongClasses := copyModelDir(t, wp, nil, "model.onnx")
	writeTinyONNX(t, filepath.Join(wrongClasses, "model.onnx"),
		[]fakeIO{{"input_ids", onnxInt64, []any{"batch", "seq"}}, {"attention_mask", onnxInt64, []any{"batch", "seq"}}},
		[]fakeIO{{"logits", onnxFloat, []any{"batch", 5}}})
	twoOutputs := copyModelDir(t, wp, nil, "model.onnx")
	writeTinyONNX(t, filepath.Join(twoOutputs, "model.onnx"),
		[]fakeIO{{"input_ids", onnxInt64, []any{"batch", "seq"}}, {"attention_mask", onnxInt64, []any{"batch", "seq"}}},
		[]fakeIO{{"scores", onnxFloat, []any{"batch", 3}}, {"pooled", onnxFloat, []any{"batch", 3}}})
	notONNX := copyModelDir(t, wp, nil, "model.onnx")
	if err := os.WriteFile(filepath.Join(notONNX, "model.onnx"), []byte("not a graph"), 0o644); err != nil {
		t.Fatal(err)
	}

	tests := []struct {
		name string
		opts LoadOptions
		want string // a fragment the message must contain
	}{
		{"empty dir option", LoadOptions{}, "Dir is empty"},
		{"missing dir", LoadOptions{Dir: filepath.Join(t.TempDir(), "nope")}, "no such file"},
		{"dir is a file", LoadOptions{Dir: filepath.Join(wp, "config.json")}, "not a directory"},
		{"missing config", LoadOptions{Dir: noConfig}, "config.json"},
		{"malformed config", LoadOptions{Dir: malformed}, "parsing"},
		{"no id2label", LoadOptions{Dir: noLabels}, "id2label has 0 entries"},
		{"id2label gap", LoadOptions{Dir: gappy}, `id2label key "5"`},
		{"no entailment label", LoadOptions{Dir: noEntail}, "no entailment label"},
		{"entailment index out of range", LoadOptions{Dir: wp, EntailmentIndex: &five}, "entailment index 5 out of range"},
		{"negative contradiction index", LoadOptions{Dir: wp, ContradictionIndex: &minus}, "contradiction index -1 out of range"},
		{"no contradiction for mode", LoadOptions{Dir: twoLabelsNoContra, ScoreMode: ScoreEntailVsContradiction}, "needs a contradiction or not_entailment label"},
		{"unknown score mode", LoadOptions{Dir: wp, ScoreMode: "logit"}, "unknown score mode"},
		{"missing onnx", LoadOptions{Dir: noONNX}, "no model.onnx or onnx/model*.onnx"},
		{"named onnx missing", LoadOptions{Dir: wp, ONNXFile: "onnx/model_int8.onnx"}, "model_int8.onnx"},
		{"absolute onnx file", LoadOptions{Dir: wp, ONNXFile: filepath.Join(wp, "model.onnx")}, "must be relative"},
		// A real graph, reached from another folder by "..".
		{"onnx file outside the folder", LoadOptions{Dir: noONNX, ONNXFile: outside}, "stay inside it"},
		{"not a graph", LoadOptions{Dir: notONNX}, "reading graph"},
		{"unknown input", LoadOptions{Dir: extraInput}, `input "position_ids"`},
		{"missing attention_mask", LoadOptions{Dir: noMask}, `lacks required input "attention_mask"`},
		{"class count mismatch", LoadOptions{Dir: wrongClasses}, "5 classes but id2label has 3"},
		{"ambiguous outputs", LoadOptions{Dir: twoOutputs}, "cannot tell which holds logits"},
		{"missing tokenizer", LoadOptions{Dir: noTokenizer}, "tokenizer"},
		{"negative max length", LoadOptions{Dir: wp, MaxLength: -1}, "negative"},
		{"max length past positions", LoadOptions{Dir: wp, MaxLength: 1024}, "exceeds max_position_embeddings 512"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m, err := Load(tc.opts)
			if err == nil {
				t.Fatalf("Load succeeded (%+v), want error containing %q", m, tc.want)
			}
			if !strings.HasPrefix(err.Error(), "model: ") || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Load error = %q, want model: prefix and %q", err, tc.want)
			}
		})
	}
}

func TestPickMaxLength(t *testing.T) {
	tests := []struct {
		req, tok, pos, want int
		wantErr             bool
	}{
		{0, 512, 512, 512, false},
		{0, 0, 0, 512, false},
		{0, 128, 512, 128, false},
		{0, 0, 256, 256, false},
		{0, 1024, 2048, 512, false},
		{64, 512, 512, 64, false},
		{600, 0, 0, 600, false},
		{600, 0, 512, 0, true},
		{-3, 512, 512, 0, true},
	}
	for _, tc := range tests {
		got, err := pickMaxLength(tc.req, tc.tok, tc.pos)
		if (err != nil) != tc.wantErr || got != tc.want {
			t.Errorf("pickMaxLength(%d, %d, %d) = %d, %v; want %d, err %v", tc.req, tc.tok, tc.pos, got, err, tc.want, tc.wantErr)
		}
	}
}

// TestVersionCoversExternalData: a graph exported with its weights in an
// external-data file beside it (model.onnx_data, model.onnx.data) gets a
// version that covers those weights: changing only them changes the
// version, the weights hashed after the graph file. On
// nli-wordpiece-small: the version is the same bytes hashed whatever the
// architecture, and each of the test's five loads of a folder with data
// files is a quarter of a DeBERTa load's CPU, an eighth under -race (no
// 8.6 MB tokenizer, no rewrite).
func TestVersionCoversExternalData(t *testing.T) {
	src := testenv.ModelDir(t, "nli-wordpiece-small")
	plain := sharedModel(t, src).SHA256
	if want := testenv.ModelVersion(t, src, "model.onnx"); plain != want {
		t.Fatalf("graph-only version %s, want %s", plain, want)
	}
	for _, name := range []string{"model.onnx_data", "model.onnx.data"} {
		var versions []string
		for _, weights := range []string{"weights v1", "weights v2"} {
			dir := copyModelDir(t, src, func(map[string]any) {})
			if err := os.WriteFile(filepath.Join(dir, name), []byte(weights), 0o644); err != nil {
				t.Fatal(err)
			}
			versions = append(versions, loadModel(t, LoadOptions{Dir: dir}).SHA256)
		}
		if versions[0] == plain || versions[1] == plain || versions[0] == versions[1] {
			t.Errorf("%s: versions graph-only %s, weights v1 %s, v2 %s: want three different", name, plain, versions[0], versions[1])
		}
	}
	dir := copyModelDir(t, src, nil)
	if err := os.WriteFile(filepath.Join(dir, "model.onnx_data"), []byte("weights v1"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got, want := loadModel(t, LoadOptions{Dir: dir}).SHA256, testenv.ModelVersion(t, dir, "model.onnx", "model.onnx_data"); got != want {
		t.Errorf("version = %s, want SHA-256 of graph then weights %s", got, want)
	}
}

// TestVersionCoversTokenizerAndConfig: the version names everything Load
// reads that decides a score, not only the graph: a fixed tokenizer.json
// (other ids for the same text), a changed config.json (id2label: another
// class read as entailment) or tokenizer_config.json (another maximum
// length) under the same graph is another version, so results, the score
// cache and the calibrations keyed on it tell the two apart. The version
// is testenv.ModelVersion's: the files in a fixed order, hashed as one
// stream. On nli-wordpiece-small (a small tokenizer, no rewrite).
func TestVersionCoversTokenizerAndConfig(t *testing.T) {
	src := testenv.ModelDir(t, "nli-wordpiece-small")
	plain := loadModel(t, LoadOptions{Dir: src}).SHA256
	if want := testenv.ModelVersion(t, src, "model.onnx"); plain != want {
		t.Errorf("version %s, want %s (config.json, tokenizer.json, tokenizer_config.json, model.onnx)", plain, want)
	}
	relabelled := copyModelDir(t, src, func(cfg map[string]any) {
		cfg["id2label"].(map[string]any)["2"] = "neutral (relabelled)"
	})
	retokenized := copyModelDir(t, src, nil, "tokenizer.json")
	// The same tokenizer, other bytes: a fix that changes ids changes
	// them too, and a test need not know which ids.
	if err := os.WriteFile(filepath.Join(retokenized, "tokenizer.json"), append(mustRead(t, filepath.Join(src, "tokenizer.json")), '\n'), 0o644); err != nil {
		t.Fatal(err)
	}
	shorter := copyModelDir(t, src, nil, "tokenizer_config.json")
	if err := os.WriteFile(filepath.Join(shorter, "tokenizer_config.json"), []byte(`{"model_max_length": 128}`), 0o644); err != nil {
		t.Fatal(err)
	}
	seen := map[string]string{plain: "the model as shipped"}
	for _, tc := range []struct{ name, dir string }{
		{"id2label changed", relabelled}, {"tokenizer.json changed", retokenized}, {"tokenizer_config.json changed", shorter},
	} {
		got := loadModel(t, LoadOptions{Dir: tc.dir}).SHA256
		if other, ok := seen[got]; ok {
			t.Errorf("%s: version %s, the same as %s's", tc.name, got, other)
		}
		seen[got] = tc.name
		if want := testenv.ModelVersion(t, tc.dir, "model.onnx"); got != want {
			t.Errorf("%s: version %s, want %s", tc.name, got, want)
		}
	}
}

func mustRead(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestStartThenWait: a session made from a model still loading (Start)
// scores as one made after Load once Wait has returned, and Wait fills the
// same model value with Load's hash and tokenizer; a broken tokenizer
// passes Start and fails Wait, every time it is asked.
func TestStartThenWait(t *testing.T) {
	dir := testenv.ModelDir(t, testenv.ProductionArch)
	want := sharedModel(t, dir)
	ld, err := Start(LoadOptions{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	s := newSession(t, ld.Model())
	m, err := ld.Wait()
	if err != nil {
		t.Fatal(err)
	}
	if m != ld.Model() || m.SHA256 != want.SHA256 || m.Tokenizer == nil || m.MaxLength != want.MaxLength {
		t.Fatalf("Wait = %p (sha256 %s, max length %d), Model() %p; Load's sha256 %s, max length %d",
			m, m.SHA256, m.MaxLength, ld.Model(), want.SHA256, want.MaxLength)
	}
	pairs := realPairs(t, want, sampleSentences...)
	got, err := s.ScorePairs(t.Context(), pairs)
	if err != nil {
		t.Fatal(err)
	}
	ref, err := newSession(t, want).ScorePairs(t.Context(), pairs)
	if err != nil {
		t.Fatal(err)
	}
	for i := range ref {
		if got[i] != ref[i] {
			t.Errorf("pair %d: %v from the session made while loading, %v after Load", i, got[i], ref[i])
		}
	}

	broken := copyModelDir(t, dir, nil, "tokenizer.json")
	if err := os.WriteFile(filepath.Join(broken, "tokenizer.json"), []byte(`{"model": {"type": "BPE"}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	ld, err = Start(LoadOptions{Dir: broken})
	if err != nil {
		t.Fatalf("Start reads no tokenizer, yet failed: %v", err)
	}
	for range 2 {
		if m, err := ld.Wait(); err == nil || m != nil || !strings.Contains(err.Error(), "model: loading tokenizer") || !strings.Contains(err.Error(), "BPE") {
			t.Errorf("Wait with a BPE tokenizer = %v, %v; want the tokenizer's error", m, err)
		}
	}
}
