package testenv

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/scorer/scorer/internal/onnxfp16"
)

// FP16File is where FP16ModelDir puts the float16 graph, relative to the
// folder: what MODEL_FILE names to select it.
const FP16File = "onnx/model_fp16.onnx"

// FP16ModelDir makes a model folder for the test: src's files (linked) and
// beside its float32 model.onnx (or onnx/model.onnx) the float16 twin at FP16File, written by
// onnxfp16 with float16 logits (Optimum's --dtype fp16 form) or, with
// keepIO, float32 logits around a float16 body. The folder has src's base
// name, so results name the same model.
func FP16ModelDir(t testing.TB, src string, keepIO bool) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), filepath.Base(src))
	if err := os.MkdirAll(filepath.Join(dir, filepath.Dir(FP16File)), 0o755); err != nil {
		t.Fatal(err)
	}
	entries, err := os.ReadDir(src)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.IsDir() {
			continue // exports' onnx/ variants: only ours is wanted
		}
		if err := os.Symlink(filepath.Join(src, e.Name()), filepath.Join(dir, e.Name())); err != nil {
			t.Fatal(err)
		}
	}
	graph := filepath.Join(src, "model.onnx")
	if _, err := os.Stat(graph); err != nil {
		graph = filepath.Join(src, "onnx", "model.onnx") // testdata/models' export layout
	}
	if _, err := onnxfp16.ConvertFile(graph, filepath.Join(dir, FP16File), onnxfp16.Options{KeepIOTypes: keepIO}); err != nil {
		t.Fatalf("making the float16 twin of %s: %v", src, err)
	}
	return dir
}
