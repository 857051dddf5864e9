package model

import (
	"crypto/sha256"
	"encoding"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// findONNX resolves the graph file: an explicit relative name, model.onnx, or
// the single onnx/model*.onnx.
func findONNX(dir, name string) (string, error) {
	if name != "" {
		// Lexical, so that a folder of symlinks (a Hugging Face cache
		// snapshot) still works; what it refuses is a name that points
		// elsewhere itself.
		if !filepath.IsLocal(name) {
			return "", fmt.Errorf("model: ONNX file %q must be relative to the model folder %s and stay inside it (no leading /, no ..)", name, dir)
		}
		p := filepath.Join(dir, name)
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("model: ONNX file: %w", err)
		}
		return p, nil
	}
	p := filepath.Join(dir, defaultONNX)
	if _, err := os.Stat(p); err == nil {
		return p, nil
	} else if !errors.Is(err, os.ErrNotExist) {
		return "", fmt.Errorf("model: ONNX file: %w", err)
	}
	cands, err := filepath.Glob(filepath.Join(dir, onnxSubdirGlob))
	if err != nil {
		return "", fmt.Errorf("model: looking for ONNX files in %s: %w", dir, err)
	}
	switch len(cands) {
	case 0:
		return "", fmt.Errorf("model: no %s or %s in %s", defaultONNX, onnxSubdirGlob, dir)
	case 1:
		return cands[0], nil
	}
	rel := make([]string, len(cands))
	for i, c := range cands {
		rel[i], _ = filepath.Rel(dir, c)
	}
	return "", fmt.Errorf("model: %d ONNX files in %s, choose one: %s", len(cands), dir, strings.Join(rel, ", "))
}

// externalDataSuffixes are the names exporters give the weights file of a
// graph saved with external data (torch.onnx and optimum: model.onnx_data;
// onnx.save_model's examples: model.onnx.data).
var externalDataSuffixes = [...]string{"_data", ".data"}

// hashModel is the model's version: the SHA-256 continued from prefix
// (versionPrefix: the config and tokenizer files), of the ONNX file,
// streamed so a multi-gigabyte graph is not held in memory twice, then of
// each external data file the graph references (data, sorted) and of an
// external-data file beside the graph by an exporter's name
// (model.onnx_data), each once: new weights under an unchanged graph must
// be a new version.
//
// A file among held (the files Load read the graph from) is read through
// its descriptor: the version is of the bytes that NewSession checks the
// files against (checkFiles), whatever the paths name meanwhile.
func hashModel(prefix []byte, path string, data []string, held []heldFile) (string, error) {
	open := map[string]*os.File{}
	for _, f := range held {
		open[f.path] = f.f
	}
	h := sha256.New()
	if err := h.(encoding.BinaryUnmarshaler).UnmarshalBinary(prefix); err != nil {
		return "", fmt.Errorf("model: version: %w", err)
	}
	graph, err := filepath.Abs(path)
	if err != nil {
		return "", err
	}
	if err := hashInto(h, path, open[graph]); err != nil {
		return "", err
	}
	files := slices.Clone(data)
	// Absolute, as data's are, so a data file both referenced and named by
	// an exporter's suffix is hashed once.
	abs, err := filepath.Abs(path)
	if err != nil {
		return "", err
	}
	for _, suffix := range externalDataSuffixes {
		if _, err := os.Stat(abs + suffix); err == nil {
			files = append(files, abs+suffix)
		}
	}
	slices.Sort(files)
	for _, f := range slices.Compact(files) {
		if err := hashInto(h, f, open[f]); err != nil {
			return "", err
		}
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// hashInto writes the file at path to h: through f when it is open (from
// its start, without moving f's offset), else opened by path.
func hashInto(h io.Writer, path string, f *os.File) error {
	var r io.Reader = io.NewSectionReader(f, 0, math.MaxInt64)
	if f == nil {
		f, err := os.Open(path)
		if err != nil {
			return fmt.Errorf("model: hashing %s: %w", path, err)
		}
		defer f.Close()
		r = f
	}
	if _, err := io.Copy(h, r); err != nil {
		return fmt.Errorf("model: hashing %s: %w", path, err)
	}
	return nil
}
