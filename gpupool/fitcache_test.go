package gpupool

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// damageCacheFile returns the ways a kept calibration file at path is
// damaged, each a function that damages it: cut short, emptied, rewritten
// for another key (from replaced by to inside it) and given a fit no
// calibration could make (unusable edits the decoded fit). A start must
// measure again after any of them.
func damageCacheFile[F any](t *testing.T, path, from, to string, unusable func(*F)) map[string]func(*testing.T) {
	edit := func(fn func([]byte) []byte) func(*testing.T) {
		return func(t *testing.T) {
			t.Helper()
			b, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(path, fn(b), 0o600); err != nil {
				t.Fatal(err)
			}
		}
	}
	return map[string]func(*testing.T){
		"truncated":   edit(func(b []byte) []byte { return b[:len(b)/2] }),
		"empty":       edit(func([]byte) []byte { return nil }),
		"another key": edit(func(b []byte) []byte { return []byte(strings.Replace(string(b), from, to, 1)) }),
		"unusable fit": edit(func(b []byte) []byte {
			var f keptFit[F]
			if err := json.Unmarshal(b, &f); err != nil {
				t.Fatal(err)
			}
			unusable(&f.Fit)
			out, err := json.Marshal(f)
			if err != nil {
				t.Fatal(err)
			}
			return out
		}),
	}
}

// A writer that dies between writing its temporary file and renaming it
// (a crash, an OOM kill) leaves a .cpu-*.tmp or .gpu-*.tmp behind; the next
// start that opens the cache removes those older than staleTemp, and leaves
// a fresh one (another process may be writing it now) and every other file.
func TestCalibrationCacheRemovesStaleTemp(t *testing.T) {
	old := time.Now().Add(-2 * staleTemp)
	write := func(t *testing.T, path string, mtime time.Time) {
		t.Helper()
		if err := os.WriteFile(path, []byte(`{"key": "half`), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(path, mtime, mtime); err != nil {
			t.Fatal(err)
		}
	}
	exists := func(path string) bool {
		_, err := os.Stat(path)
		return err == nil
	}
	for _, kind := range []string{"cpu", "gpu"} {
		t.Run(kind, func(t *testing.T) {
			dir := t.TempDir()
			stale := filepath.Join(dir, "."+kind+"-1234567.tmp")
			fresh := filepath.Join(dir, "."+kind+"-7654321.tmp")
			other := filepath.Join(dir, "notes.tmp")
			write(t, stale, old)
			write(t, fresh, time.Now())
			write(t, other, old)
			if kind == "cpu" {
				fake := &fakeEngine{}
				startCPUCalibration(t, keyedEngine{fakeEngine: fake, key: "model=a"}, fake, 2<<30, CPUMemoryConfig{CacheDir: dir})
			} else {
				startGPU(t, cacheKeyA, "GPU-a", dir)
			}
			if exists(stale) {
				t.Errorf("%s, left by a writer %v ago, is still there", filepath.Base(stale), 2*staleTemp)
			}
			if !exists(fresh) || !exists(other) {
				t.Errorf("removed a fresh temporary file (%v) or another file (%v)", !exists(fresh), !exists(other))
			}
		})
	}
}
