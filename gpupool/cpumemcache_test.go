package gpupool

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"testing"
)

// keyedEngine is a fake engine that names what its memory depends on, as
// model.Session does.
type keyedEngine struct {
	*fakeEngine
	key string
}

func (e keyedEngine) MemoryKey() string { return e.key }

// TestCPUMemoryCalibrationCache: with CacheDir, a start whose engine key
// matches an earlier one's takes the kept fit without running a batch, and
// sets its budget from the resident memory it measures now; another key,
// an unreadable file and a file written for another key are measured again
// (and the file rewritten); an engine with no key, or an unusable
// directory, still calibrates and starts.
func TestCPUMemoryCalibrationCache(t *testing.T) {
	dir := t.TempDir()
	start := func(t *testing.T, eng Engine, fake *fakeEngine, rss uint64, cacheDir string) (DeviceStats, int) {
		t.Helper()
		return startCPUCalibration(t, eng, fake, rss, CPUMemoryConfig{CacheDir: cacheDir})
	}
	keyed := func(key string) (Engine, *fakeEngine) {
		f := &fakeEngine{}
		return keyedEngine{fakeEngine: f, key: key}, f
	}
	files := func(t *testing.T) []string {
		t.Helper()
		m, err := filepath.Glob(filepath.Join(dir, "cpu-*.json"))
		if err != nil {
			t.Fatal(err)
		}
		return m
	}

	eng, fake := keyed("model=a ort=1.30.0 intra_op=1")
	first, runs := start(t, eng, fake, 2<<30, dir)
	if runs == 0 || first.Memory.PerTokenLen <= 0 {
		t.Fatalf("first start: %d calibration runs, estimate %+v: want a measured fit", runs, first)
	}
	kept := files(t)
	if len(kept) != 1 {
		t.Fatalf("cache files after the first start: %v, want one", kept)
	}
	path := kept[0]

	eng, fake = keyed("model=a ort=1.30.0 intra_op=1")
	again, runs := start(t, eng, fake, 3<<30, dir)
	if runs != 0 {
		t.Errorf("same key: %d calibration runs, want none (the kept fit)", runs)
	}
	if again.Memory.Base != first.Memory.Base || again.Memory.PerToken != first.Memory.PerToken || again.Memory.PerTokenLen != first.Memory.PerTokenLen {
		t.Errorf("same key: estimate %+v, want the first start's %+v", again, first)
	}
	if again.Memory.BaselineBytes != 3<<30 {
		t.Errorf("same key: baseline %d bytes, want the resident size measured now (%d)", again.Memory.BaselineBytes, 3<<30)
	}

	eng, fake = keyed("model=b ort=1.30.0 intra_op=1")
	if _, runs = start(t, eng, fake, 2<<30, dir); runs == 0 {
		t.Error("another key took a kept fit")
	}
	if f := files(t); len(f) != 2 {
		t.Errorf("cache files after a second key: %v, want two", f)
	}

	for name, damage := range damageCacheFile(t, path, "model=a", "model=z", func(f *cpuFit) { *f = cpuFit{Base: 1, PerToken: -5} }) {
		t.Run(name, func(t *testing.T) {
			damage(t)
			eng, fake := keyed("model=a ort=1.30.0 intra_op=1")
			if _, runs := start(t, eng, fake, 2<<30, dir); runs == 0 {
				t.Fatal("a damaged cache file was trusted")
			}
			eng, fake = keyed("model=a ort=1.30.0 intra_op=1")
			if _, runs := start(t, eng, fake, 2<<30, dir); runs != 0 {
				t.Errorf("the file was not rewritten after measuring again: %d runs at the next start", runs)
			}
		})
	}

	t.Run("no key", func(t *testing.T) {
		for range 2 {
			f := &fakeEngine{}
			if _, runs := start(t, f, f, 2<<30, dir); runs == 0 {
				t.Error("an engine without MemoryKey took a kept fit")
			}
		}
		eng, fake := keyed("")
		if _, runs := start(t, eng, fake, 2<<30, dir); runs == 0 {
			t.Error("an engine with an empty MemoryKey took a kept fit")
		}
	})
	t.Run("unusable directory", func(t *testing.T) {
		notDir := filepath.Join(t.TempDir(), "file")
		if err := os.WriteFile(notDir, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		eng, fake := keyed("model=a ort=1.30.0 intra_op=1")
		if st, runs := start(t, eng, fake, 2<<30, notDir); runs == 0 || st.Memory.PerTokenLen <= 0 {
			t.Errorf("a cache directory that cannot be made: %d runs, estimate %+v; want a measured fit and a start", runs, st)
		}
	})
}

// With CachedOnly, a start takes a kept fit as any start would, and without
// one runs no calibration batch at all: the pool starts with CPU batches
// bounded by rows and tokens only (no batch budget).
func TestCPUMemoryCachedOnly(t *testing.T) {
	dir := t.TempDir()
	start := func(t *testing.T, key string, cachedOnly bool) (DeviceStats, int) {
		t.Helper()
		fake := &fakeEngine{}
		return startCPUCalibration(t, keyedEngine{fakeEngine: fake, key: key}, fake, 2<<30, CPUMemoryConfig{CacheDir: dir, CachedOnly: cachedOnly})
	}
	if st, runs := start(t, "model=a", true); runs != 0 || st.Memory.BudgetBytes != 0 {
		t.Errorf("nothing kept: %d calibration runs, batch budget %.0f bytes; want none and none", runs, st.Memory.BudgetBytes)
	}
	measured, _ := start(t, "model=a", false)
	if st, runs := start(t, "model=a", true); runs != 0 || st.Memory.BudgetBytes != measured.Memory.BudgetBytes || st.Memory.BudgetBytes <= 0 {
		t.Errorf("kept fit: %d calibration runs, batch budget %.0f bytes; want none and the measured %.0f", runs, st.Memory.BudgetBytes, measured.Memory.BudgetBytes)
	}
}

// startCPUCalibration starts a CPU pool on eng (fake is its fakeEngine)
// with DeBERTa-like memory per batch over rss resident bytes, and returns
// its device's stats and how many batches calibration ran.
func startCPUCalibration(t *testing.T, eng Engine, fake *fakeEngine, rss uint64, mc CPUMemoryConfig) (DeviceStats, int) {
	t.Helper()
	mem := &fakeMemory{rss: rss, cost: debertaCPU}
	return startCPUPoolOn(t, eng, fake, mem, mem.run, mc)
}

// startCPUPoolOn is startCPUCalibration over any process memory, run
// being what each batch does to it.
func startCPUPoolOn(t *testing.T, eng Engine, fake *fakeEngine, mem processMemory, run func(rows, maxLen int), mc CPUMemoryConfig) (DeviceStats, int) {
	t.Helper()
	fake.maxLength = 512
	fake.onRun = run
	p, err := New(testCtx(t), func(Device) (Engine, error) { return eng, nil }, Mode(ModeCPU), CPUWorkers(2), MaxBatchRows(16),
		MaxBatchTokens(16384), withProcessMemory(mem), CPUMemory(mc))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close(testCtx(t)) })
	fake.mu.Lock()
	defer fake.mu.Unlock()
	return p.Stats().Devices[0], fake.calls
}

// A cache written by the release before glibc's mmap threshold was fixed
// (ortenv.InitRuntime) holds a fit measured another way: such fits could lose
// their quadratic term, and long CPU batches planned on one run past
// CPU_MEM_LIMIT. previousCPUCacheFile writes the file exactly as that release
// did, under the key and name it used, with such a fit; a start with the
// same engine must measure again rather than take it.
func TestCPUCalibrationCacheOfPreviousMethodNotReused(t *testing.T) {
	dir := t.TempDir()
	const memKey = "model=a max_len=512 ort=1.30.0 intra_op=1 inter_op=1 mem_pattern=true rewritten=false"
	// startCPUCalibration's engine and defaults: maximum length 512, the
	// adaptive shapes at RefLen 128, token 1.
	path := previousCPUCacheFile(t, dir, memKey, defaultCPUShapes(128, 512), true, 128, 1)

	fake := &fakeEngine{}
	st, runs := startCPUCalibration(t, keyedEngine{fakeEngine: fake, key: memKey}, fake, 2<<30, CPUMemoryConfig{CacheDir: dir})
	if runs == 0 {
		t.Fatalf("took the previous release's fit (%+v) from %s without measuring", st.Memory, path)
	}
	if st.Memory.PerTokenLen <= 0 {
		t.Errorf("measured fit %+v lacks the quadratic term", st.Memory)
	}
	// What was measured now is kept, and taken by the next start.
	fake = &fakeEngine{}
	if _, runs := startCPUCalibration(t, keyedEngine{fakeEngine: fake, key: memKey}, fake, 2<<30, CPUMemoryConfig{CacheDir: dir}); runs != 0 {
		t.Errorf("the next start ran %d calibration batches, want the fit kept by the start before", runs)
	}
}

// previousCPUCacheFile writes a CPU calibration file as the release before
// the calibration-method key wrote it (key version 1: its key, name and
// JSON layout), with a fit that lost its quadratic term, and returns its
// path.
func previousCPUCacheFile(t *testing.T, dir, memKey string, shapes []Shape, adaptive bool, refLen int, tokenID int32) string {
	t.Helper()
	key := fmt.Sprintf("v=%d %s", 1, memKey) +
		fmt.Sprintf(" shapes=%v adaptive=%t ref_len=%d token_id=%d", shapes, adaptive, refLen, tokenID) +
		fmt.Sprintf(" os=%s/%s cpu=%q thp=%q", runtime.GOOS, runtime.GOARCH, cpuIdentity(), firstLine("/sys/kernel/mm/transparent_hugepage/enabled"))
	return writePreviousCacheFile(t, dir, "cpu", key, `
  "fit": {
    "base_bytes": 3145728,
    "bytes_per_token": 46000,
    "bytes_per_token_len": 0
  },
  "points": [
    {
      "rows": 1,
      "len": 32,
      "bytes": 4603904
    },
    {
      "rows": 1,
      "len": 512,
      "bytes": 26214400
    }
  ],
  "calibrated": "2026-11-20T10:00:00Z"
}
`)
}

// writePreviousCacheFile writes a calibration cache file of kind ("cpu",
// "gpu") as the releases before issue 44 did: named by the first 12 bytes
// of key's SHA-256 in hex, the key first, then rest (the JSON after the
// key's comma), mode 0600. It returns the file's path.
func writePreviousCacheFile(t *testing.T, dir, kind, key, rest string) string {
	t.Helper()
	sum := sha256.Sum256([]byte(key))
	path := filepath.Join(dir, kind+"-"+hex.EncodeToString(sum[:12])+".json")
	quotedKey, err := json.Marshal(key)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte("{\n  \"key\": "+string(quotedKey)+","+rest), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// The C heap's settings from the environment change what calibration
// reads (a preloaded allocator, glibc's malloc tunables): a fit kept under
// one setting is not taken under another, and is taken again under its own.
func TestCPUCalibrationCacheKeyHasMallocEnv(t *testing.T) {
	dir := t.TempDir()
	start := func(t *testing.T, topPad string) int {
		t.Helper()
		t.Setenv("MALLOC_TOP_PAD_", topPad)
		fake := &fakeEngine{}
		_, runs := startCPUCalibration(t, keyedEngine{fakeEngine: fake, key: "model=a"}, fake, 2<<30, CPUMemoryConfig{CacheDir: dir})
		return runs
	}
	if runs := start(t, "131072"); runs == 0 {
		t.Fatal("the first start took a fit from an empty cache")
	}
	if runs := start(t, "1048576"); runs == 0 {
		t.Error("another MALLOC_TOP_PAD_ took the fit kept under the first")
	}
	if runs := start(t, "131072"); runs != 0 {
		t.Errorf("the first setting again ran %d calibration batches, want its kept fit", runs)
	}
}
