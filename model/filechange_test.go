package model

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/scorer/scorer/internal/testenv"
)

// writableModelDir is a model folder for the test whose graph (and data
// file, if any) are copies the test may change; the other files are links.
func writableModelDir(t *testing.T, src string) string {
	t.Helper()
	dir := copyModelDir(t, src, nil, "model.onnx")
	if err := os.WriteFile(filepath.Join(dir, "model.onnx"), mustRead(t, filepath.Join(src, "model.onnx")), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// flipInPlaceT is testenv.FlipInPlace with the *testing.T signature the
// table's changes share.
func flipInPlaceT(t *testing.T, path string) { testenv.FlipInPlace(t, path) }

// replaceByRename writes changed bytes of the file at path to a new file
// and renames it over path: a new inode, as `mv`, rsync or a volume's
// update (a folder of links swapped) give.
func replaceByRename(t *testing.T, path string) {
	t.Helper()
	renameOver(t, path, func(b []byte) {
		for i := len(b) / 2; i < len(b); i++ {
			b[i] ^= 0x01
		}
	})
}

// renameOver writes the file at path, edited by edit, to a new file and
// renames it over path.
func renameOver(t *testing.T, path string, edit func([]byte)) {
	t.Helper()
	b := mustRead(t, path)
	edit(b)
	tmp := path + ".new"
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// TestModelFileChanged: a session created after a model file changed on
// disk never runs bytes other than those Load read and hashed. A file
// changed in place (same inode: rewritten, or shrunk) or replaced by
// another (renamed over it) is refused by NewSession with
// ErrModelFileChanged, in one line naming the file and saying to restart;
// a file only touched, or replaced by a copy of the same bytes, leaves
// new sessions scoring as the first did. The same holds for an external
// data file. The first case is the reproduction, on the DeBERTa
// export; the others load nli-wordpiece-small, whose tokenizer parses in
// a tenth of the time under the race detector (every case loads its own
// copy of a model).
func TestModelFileChanged(t *testing.T) {
	const deberta, bert = "nli-deberta-v3-hf-tiny", "nli-wordpiece-small"
	for _, tc := range []struct {
		name     string
		model    string
		external bool
		file     string // changed, in the model folder
		change   func(t *testing.T, path string)
		refused  bool
	}{
		{"in place", deberta, false, "model.onnx", flipInPlaceT, true},
		{"shrunk", bert, false, "model.onnx", func(t *testing.T, path string) {
			st, err := os.Stat(path)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.Truncate(path, st.Size()/2); err != nil {
				t.Fatal(err)
			}
		}, true},
		{"renamed over", bert, false, "model.onnx", replaceByRename, true},
		// One case for both, as they take the same path (a stamp moved:
		// the files are hashed again) and each case loads a model.
		{"touched and copied over with the same bytes", bert, false, "model.onnx", func(t *testing.T, path string) {
			later := time.Now().Add(time.Hour)
			if err := os.Chtimes(path, later, later); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(path, 0o600); err != nil {
				t.Fatal(err)
			}
			renameOver(t, path, func([]byte) {})
		}, false},
		{"external in place", bert, true, "model.onnx_data", flipInPlaceT, true},
		{"external renamed over", bert, true, "model.onnx_data", replaceByRename, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src := testenv.ModelDir(t, tc.model)
			var dir string
			if tc.external {
				dir = testenv.ExternalDataModelDir(t, src, testenv.OneDataFile)
			} else {
				dir = writableModelDir(t, src)
			}
			m := loadModel(t, LoadOptions{Dir: dir})
			sha := m.SHA256
			pairs := externalPairs(t, m)
			first := newSession(t, m)
			want, err := first.Logits(t.Context(), pairs)
			if err != nil {
				t.Fatal(err)
			}
			path := filepath.Join(dir, tc.file)
			tc.change(t, path)

			s, err := m.NewSession(noSpinning)
			if tc.refused {
				if err == nil {
					got, lerr := s.Logits(t.Context(), pairs)
					s.Close()
					d := -1.0
					if lerr == nil {
						d = maxDiff(want, got)
					}
					t.Fatalf("NewSession after %s changed (%s) succeeded: max |Δlogit| %.3g from the first session (run error %v), version still %s", tc.file, tc.name, d, lerr, m.SHA256)
				}
				if !errors.Is(err, ErrModelFileChanged) || !strings.Contains(err.Error(), path) ||
					!strings.Contains(err.Error(), "restart") || strings.Contains(err.Error(), "\n") {
					t.Fatalf("NewSession: %v; want one line with ErrModelFileChanged, the file %s and \"restart\"", err, path)
				}
				t.Logf("refused: %v", err)
				// Asked again (gpupool does, for each batch no device can
				// run), the same files are refused the same way.
				if s, again := m.NewSession(noSpinning); again == nil || again.Error() != err.Error() {
					if s != nil {
						s.Close()
					}
					t.Fatalf("NewSession again: %v; want %v", again, err)
				}
				return
			}
			if err != nil {
				t.Fatalf("NewSession after %s changed (%s): %v", tc.file, tc.name, err)
			}
			defer s.Close()
			got, err := s.Logits(t.Context(), pairs)
			if err != nil {
				t.Fatal(err)
			}
			if d := maxDiff(want, got); d > 1e-5 || m.SHA256 != sha {
				t.Errorf("after %s changed (%s): max |Δlogit| %.3g from the first session (want ≤ 1e-5: the bytes loaded), version %s (loaded %s)", tc.file, tc.name, d, m.SHA256, sha)
			}
		})
	}
}

// TestCheckFilesSeesWritesThatKeepTimes: a model file written in place
// with its size and modification time kept (testenv.FlipInPlace: what
// `rsync --inplace -t`, `cp -p` from an artifact with normalised
// timestamps or `touch -r` give) fails CheckFiles, the liveness check, with
// ErrModelFileChanged: sessions already open map the new weights under
// the old version. A change of the file's status alone (chmod: it moves
// the ctime too) costs one hash and no failure, and the check is cheap
// again after it. For the graph file and an external data file, on
// nli-wordpiece-small (no rewrite, a small tokenizer: the two loads cost
// little under -race).
func TestCheckFilesSeesWritesThatKeepTimes(t *testing.T) {
	for _, tc := range []struct {
		name, file string
		external   bool
	}{{"graph", "model.onnx", false}, {"external data", "model.onnx_data", true}} {
		t.Run(tc.name, func(t *testing.T) {
			src := testenv.ModelDir(t, "nli-wordpiece-small")
			var dir string
			if tc.external {
				dir = testenv.ExternalDataModelDir(t, src, testenv.OneDataFile)
			} else {
				dir = writableModelDir(t, src)
			}
			m := loadModel(t, LoadOptions{Dir: dir})
			path := filepath.Join(dir, tc.file)
			if err := m.CheckFiles(); err != nil {
				t.Fatalf("CheckFiles before any change: %v", err)
			}
			if err := os.Chmod(path, 0o600); err != nil {
				t.Fatal(err)
			}
			if err := m.CheckFiles(); err != nil {
				t.Fatalf("CheckFiles after chmod alone: %v; want nil (the same bytes)", err)
			}
			before, err := os.Stat(path)
			if err != nil {
				t.Fatal(err)
			}
			testenv.FlipInPlace(t, path)
			after, err := os.Stat(path)
			if err != nil {
				t.Fatal(err)
			}
			if !os.SameFile(before, after) || before.Size() != after.Size() || !before.ModTime().Equal(after.ModTime()) {
				t.Fatalf("FlipInPlace changed the inode, size or mtime: %v %d -> %v %d", before.ModTime(), before.Size(), after.ModTime(), after.Size())
			}
			err = m.CheckFiles()
			if !errors.Is(err, ErrModelFileChanged) || !strings.Contains(err.Error(), path) {
				t.Fatalf("CheckFiles after %s was written in place with its size and mtime kept: %v; want ErrModelFileChanged naming %s", tc.file, err, path)
			}
			t.Logf("refused: %v", err)
		})
	}
}
