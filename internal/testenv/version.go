package testenv

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"
)

// ModelVersion is the version (model.Model.SHA256) of the model folder
// dir whose graph is made of files (the graph file, then its external
// data files in their sorted order, as paths relative to dir): the
// SHA-256 of config.json, tokenizer.json and tokenizer_config.json (when
// present), then the graph's files, read one after another, as
// `cat config.json tokenizer.json tokenizer_config.json model.onnx |
// sha256sum` gives it. Tests compare what Load computes with it.
func ModelVersion(t testing.TB, dir string, files ...string) string {
	t.Helper()
	h := sha256.New()
	for i, name := range append([]string{"config.json", "tokenizer.json", "tokenizer_config.json"}, files...) {
		f, err := os.Open(filepath.Join(dir, name))
		if i == 2 && errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		_, err = io.Copy(h, f)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
	}
	return hex.EncodeToString(h.Sum(nil))
}
