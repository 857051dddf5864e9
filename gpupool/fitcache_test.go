package gpupool

import (
	"encoding/json"
	"os"
	"strings"
	"testing"
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
