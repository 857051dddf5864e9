package model

import (
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/scorer/scorer/internal/testenv"
	"github.com/scorer/scorer/model/onnxpb"
)

// externalPairs are real pairs for comparing a model's logits across the
// forms of its graph: short sentences and one past 129 tokens (log buckets).
func externalPairs(t *testing.T, m *Model) []Pair {
	t.Helper()
	var sentences []string
	for _, ev := range testenv.FirstTranscripts(t, 1, 4) {
		for _, sec := range ev.Sections {
			sentences = append(sentences, sec...)
		}
	}
	sentences = append(sentences, strings.Join(sentences, " "))
	pairs := make([]Pair, len(sentences))
	for i, s := range sentences {
		p, err := m.EncodeText(s, "This text is about consumer weakness.")
		if err != nil {
			t.Fatal(err)
		}
		pairs[i] = p
	}
	return pairs
}

// TestExternalData: the shared HF export re-saved with external data, as
// torch.onnx and Optimum save large models (one model.onnx_data) and as
// onnx.save_model does with a file per tensor (in a subfolder), loads with
// and without the relative-attention rewrite and scores within 1e-5 of the
// same graph inline; its version covers the data files.
func TestExternalData(t *testing.T) {
	if testing.Short() {
		t.Skip("seven loads of the HF export in three layouts; make test runs it (-short keeps TestExternalDataVersion's and TestSymlinkedModelFolder's external loads)")
	}
	src := testenv.ModelDir(t, "nli-deberta-v3-hf-tiny")
	inline := sharedModel(t, src)
	pairs := externalPairs(t, inline)
	want, err := newSession(t, inline).Logits(t.Context(), pairs)
	if err != nil {
		t.Fatal(err)
	}
	// WriteExternalData's form (bench's) beside the test's own two.
	written := copyModelDir(t, src, nil, "model.onnx")
	if err := WriteExternalData(filepath.Join(src, "model.onnx"), filepath.Join(written, "model.onnx")); err != nil {
		t.Fatal(err)
	}
	dirs := map[string]string{"WriteExternalData": written}
	for i, layout := range []testenv.ExternalLayout{testenv.OneDataFile, testenv.FilePerTensor} {
		dirs[fmt.Sprint("layout", i)] = testenv.ExternalDataModelDir(t, src, layout)
	}
	for name, dir := range dirs {
		for _, keep := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/keep=%t", name, keep), func(t *testing.T) {
				m := loadModel(t, LoadOptions{Dir: dir, KeepRelativeAttention: keep})
				if m.relAttn == keep {
					t.Errorf("rewritten %t with KeepRelativeAttention %t: %s", m.relAttn, keep, m.GraphRewrite)
				}
				if len(m.dataFiles) == 0 || m.SHA256 == inline.SHA256 {
					t.Errorf("data files %v, version %s (inline %s): want the data files found and hashed", m.dataFiles, m.SHA256, inline.SHA256)
				}
				got, err := newSession(t, m).Logits(t.Context(), pairs)
				if err != nil {
					t.Fatal(err)
				}
				if d := maxDiff(want, got); d > 1e-5 {
					t.Errorf("max |Δlogit| vs inline %.3g > 1e-5 (%s)", d, m.GraphRewrite)
				}
			})
		}
	}
}

// TestExternalDataVersion: the version of a graph with one data file is
// the SHA-256 of the graph, then the data, each once, whether the folder
// is named by an absolute or a relative path (the data file, referenced
// by the graph and named as exporters name it, was hashed twice under a
// relative MODEL_DIR). On nli-wordpiece-small: the hash does not depend on
// the architecture, and its two loads cost a quarter of DeBERTa's
// (TestExternalData and TestSymlinkedModelFolder load the HF export with
// external data).
func TestExternalDataVersion(t *testing.T) {
	dir := testenv.ExternalDataModelDir(t, testenv.ModelDir(t, "nli-wordpiece-small"), testenv.OneDataFile)
	want := testenv.ModelVersion(t, dir, "model.onnx", "model.onnx_data")
	if got := loadModel(t, LoadOptions{Dir: dir}).SHA256; got != want {
		t.Errorf("absolute folder: version %s, want %s", got, want)
	}
	t.Chdir(filepath.Dir(dir))
	if got := loadModel(t, LoadOptions{Dir: filepath.Base(dir)}).SHA256; got != want {
		t.Errorf("relative folder: version %s, want %s", got, want)
	}
}

// TestSymlinkedModelFolder: a folder whose files are links elsewhere (a
// Hugging Face cache snapshot, a Kubernetes volume of links) scores, with
// its weights inline and in an external data file. Under -short the
// external one (its graph and data file both reached through links); make
// test, and ORT_CORE_TESTS on the CUDA core, run both.
func TestSymlinkedModelFolder(t *testing.T) {
	src := testenv.ModelDir(t, "nli-deberta-v3-hf-tiny")
	for name, target := range map[string]string{"inline": src, "external": testenv.ExternalDataModelDir(t, src, testenv.OneDataFile)} {
		if testing.Short() && name == "inline" {
			t.Logf("-short: %s skipped, the external folder's links checked; make test runs both", name)
			continue
		}
		t.Run(name, func(t *testing.T) {
			dir := copyModelDir(t, target, nil)
			m := loadModel(t, LoadOptions{Dir: dir})
			pairs := externalPairs(t, m)
			if _, err := newSession(t, m).Logits(t.Context(), pairs); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestExternalDataErrors: a data file that is missing, a location that
// leaves the graph's folder and a range past the file's end (with or
// without a length, or so far that offset plus length overflows) or of a
// negative length are refused by Load with one line naming the tensor,
// before any session.
func TestExternalDataErrors(t *testing.T) {
	src := testenv.ExternalDataModelDir(t, testenv.ModelDir(t, "nli-deberta-v3-hf-tiny"), testenv.OneDataFile)
	for _, tc := range []struct {
		name string
		edit func(t *testing.T, dir string, kv map[string]*onnxpb.StringStringEntryProto)
		want string
	}{
		{"missing", func(t *testing.T, dir string, _ map[string]*onnxpb.StringStringEntryProto) {
			if err := os.Remove(filepath.Join(dir, "model.onnx_data")); err != nil {
				t.Fatal(err)
			}
		}, "no such file"},
		{"escapes", func(_ *testing.T, _ string, kv map[string]*onnxpb.StringStringEntryProto) {
			kv["location"].Value = proto.String("../elsewhere/model.onnx_data")
		}, "not a path inside"},
		{"absolute", func(_ *testing.T, _ string, kv map[string]*onnxpb.StringStringEntryProto) {
			kv["location"].Value = proto.String("/etc/passwd")
		}, "not a path inside"},
		{"past end", func(_ *testing.T, _ string, kv map[string]*onnxpb.StringStringEntryProto) {
			kv["offset"].Value = proto.String("1000000000")
		}, "which has"},
		{"past end without length", func(_ *testing.T, _ string, kv map[string]*onnxpb.StringStringEntryProto) {
			kv["offset"].Value = proto.String("1000000000")
			// A key ONNX defines and Load ignores: the reference has no
			// length, so it runs to the file's end.
			kv["length"].Key = proto.String("checksum")
		}, "which has"},
		{"negative length", func(_ *testing.T, _ string, kv map[string]*onnxpb.StringStringEntryProto) {
			kv["length"].Value = proto.String("-1")
		}, `bad length "-1"`},
		{"overflowing range", func(_ *testing.T, _ string, kv map[string]*onnxpb.StringStringEntryProto) {
			kv["offset"].Value = proto.String(strconv.FormatInt(math.MaxInt64-100, 10))
			kv["length"].Value = proto.String("1000")
		}, "which has"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			for _, name := range []string{"config.json", "tokenizer.json", "tokenizer_config.json", "model.onnx_data"} {
				data := mustRead(t, filepath.Join(src, name))
				if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			m := &onnxpb.ModelProto{}
			if err := proto.Unmarshal(mustRead(t, filepath.Join(src, "model.onnx")), m); err != nil {
				t.Fatal(err)
			}
			var first *onnxpb.TensorProto
			for _, init := range m.GetGraph().GetInitializer() {
				if init.GetDataLocation() == onnxpb.TensorProto_EXTERNAL {
					first = init
					break
				}
			}
			kv := map[string]*onnxpb.StringStringEntryProto{}
			for _, e := range first.GetExternalData() {
				kv[e.GetKey()] = e
			}
			tc.edit(t, dir, kv)
			b, err := proto.Marshal(m)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, "model.onnx"), b, 0o644); err != nil {
				t.Fatal(err)
			}
			_, err = Load(LoadOptions{Dir: dir})
			if !errors.Is(err, ErrExternalData) || !strings.Contains(err.Error(), tc.want) ||
				!strings.Contains(err.Error(), first.GetName()) || strings.Contains(err.Error(), "\n") {
				t.Errorf("Load: %v; want one line with ErrExternalData, %q and the tensor's name %s", err, tc.want, first.GetName())
			}
		})
	}
}
