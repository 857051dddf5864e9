// Package testenv finds the real parts tests run against: the shared models
// and transcripts beside the repository and the ONNX Runtime library that
// `make` fetches. Tests fail, not skip, when a part is missing: a test that
// silently skips its real dependency proves nothing.
package testenv

import (
	"crypto/sha256"
	"encoding/hex"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// RepoRoot is the repository root, found from this file's location.
func RepoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

// SharedDir is ../shared beside the repository, or $SHARED_DIR.
func SharedDir(t testing.TB) string {
	t.Helper()
	dir := os.Getenv("SHARED_DIR")
	if dir == "" {
		dir = filepath.Join(RepoRoot(), "..", "shared")
	}
	if _, err := os.Stat(dir); err != nil {
		t.Fatalf("shared material not found at %s (set SHARED_DIR): %v", dir, err)
	}
	return dir
}

// ModelDirs lists every model folder under shared/models and the
// repository's testdata/models (the tiny byte-level BPE models made by
// tools/tiny-models): those with a config.json. A folder holding only a
// tokenizer (deberta-v3-tokenizer) is not a model; TokenizerDirs lists it.
func ModelDirs(t testing.TB) []string {
	t.Helper()
	return globDirs(t, "config.json")
}

// TokenizerDirs lists every folder under shared/models and testdata/models
// with a tokenizer.json: the model folders and tokenizer-only ones.
func TokenizerDirs(t testing.TB) []string {
	t.Helper()
	return globDirs(t, "tokenizer.json")
}

// RepoModelsDir is the repository's own model folders, committed with the
// scripts that made them.
func RepoModelsDir() string {
	return filepath.Join(RepoRoot(), "testdata", "models")
}

func globDirs(t testing.TB, file string) []string {
	t.Helper()
	var dirs []string
	for _, root := range []string{filepath.Join(SharedDir(t), "models"), RepoModelsDir()} {
		found, err := filepath.Glob(filepath.Join(root, "*", file))
		if err != nil || len(found) == 0 {
			t.Fatalf("no folders with a %s under %s", file, root)
		}
		for _, f := range found {
			dirs = append(dirs, filepath.Dir(f))
		}
	}
	return dirs
}

// ProductionArch names the model folder with the production model's
// architecture and tokenizer (DeBERTa-v3: relative-position attention, no
// token_type_ids, the 128k-piece vocabulary), tiny and with random weights.
const ProductionArch = "nli-deberta-v3-tiny"

// ScorerModelDir is the model folder every in-test scorer runs (ScorerEnv):
// $TEST_MODEL_DIR when set, a path or a folder name (ModelDir), to
// run the system tests on another model; else ProductionArch.
func ScorerModelDir(t testing.TB) string {
	t.Helper()
	dir := os.Getenv("TEST_MODEL_DIR")
	if dir == "" {
		return ModelDir(t, ProductionArch)
	}
	if !strings.ContainsRune(dir, filepath.Separator) {
		return ModelDir(t, dir)
	}
	if _, err := os.Stat(filepath.Join(dir, "config.json")); err != nil {
		t.Fatalf("TEST_MODEL_DIR: %v", err)
	}
	return dir
}

// ModelDir is one named model folder under shared/models or, for the
// repository's own, testdata/models.
func ModelDir(t testing.TB, name string) string {
	t.Helper()
	dir := filepath.Join(SharedDir(t), "models", name)
	if _, err := os.Stat(filepath.Join(dir, "config.json")); err == nil {
		return dir
	}
	own := filepath.Join(RepoModelsDir(), name)
	if _, err := os.Stat(filepath.Join(own, "config.json")); err != nil {
		t.Fatalf("model %s: in neither %s nor %s", name, filepath.Dir(dir), RepoModelsDir())
	}
	return own
}

// DeBERTaGraphs are the three DeBERTa-v2 graph families every graph rewrite
// must handle, each 2 layers of 2 heads: make_deberta.py's export
// (nli-deberta-v3-tiny), HF's own model through the TorchScript exporter
// (nli-deberta-v3-hf-tiny, with If nodes) and the dynamo exporter's (a
// fixture with a 1,000-row vocabulary), by a short name.
func DeBERTaGraphs(t testing.TB) map[string]string {
	t.Helper()
	shared := SharedDir(t)
	return map[string]string{
		"make_deberta":   filepath.Join(shared, "models", "nli-deberta-v3-tiny", "model.onnx"),
		"hf-torchscript": filepath.Join(shared, "models", "nli-deberta-v3-hf-tiny", "model.onnx"),
		"hf-dynamo":      filepath.Join(shared, "fixtures", "deberta-v2-dynamo", "model.onnx"),
	}
}

// Transcripts is the path of the real transcript corpus.
func Transcripts(t testing.TB) string {
	t.Helper()
	return filepath.Join(SharedDir(t), "data", "transcripts", "transcripts.jsonl")
}

// ORTLib is the ONNX Runtime shared library: $ORT_LIB, or DefaultORTLib.
func ORTLib(t testing.TB) string {
	t.Helper()
	lib := os.Getenv("ORT_LIB")
	if lib == "" {
		lib = DefaultORTLib()
	}
	if _, err := os.Stat(lib); err != nil {
		t.Fatalf("ONNX Runtime library not found at %s (run `make ort` or set ORT_LIB): %v", lib, err)
	}
	return lib
}

// DefaultORTLib is where `make ort` puts the core of the "cpu" set of
// deploy/ort/pins.txt: .deps/ort-VERSION/libonnxruntime.so.1. For TestMain
// functions, which have no testing.TB; empty when the pin list has no
// readable cpu row.
func DefaultORTLib() string {
	data, err := os.ReadFile(filepath.Join(RepoRoot(), "deploy", "ort", "pins.txt"))
	if err != nil {
		return ""
	}
	for line := range strings.SplitSeq(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) == 5 && f[0] == "cpu" && f[3] == "libonnxruntime.so.1" {
			if _, version, ok := strings.Cut(f[1], "@"); ok {
				return filepath.Join(RepoRoot(), ".deps", "ort-"+version, "libonnxruntime.so.1")
			}
		}
	}
	return ""
}

// ORTCUDADir is the CUDA image's ONNX Runtime directory, the core and its
// CUDA provider libraries: $ORT_CUDA_DIR, or the one `make cuda-ort` puts
// under .deps.
func ORTCUDADir(t testing.TB) string {
	t.Helper()
	dir := os.Getenv("ORT_CUDA_DIR")
	if dir == "" {
		dir = filepath.Join(RepoRoot(), ".deps", "ort-cuda")
	}
	if _, err := os.Stat(filepath.Join(dir, "libonnxruntime.so.1")); err != nil {
		t.Fatalf("CUDA ONNX Runtime files not found in %s (run `make cuda-ort` or set ORT_CUDA_DIR): %v", dir, err)
	}
	return dir
}

// SHA256File is the hex SHA-256 of a file's bytes, the form model versions
// and the ORT pin list use.
func SHA256File(t testing.TB, path string) string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(h.Sum(nil))
}
