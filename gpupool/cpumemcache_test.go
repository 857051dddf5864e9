package gpupool

import (
	"os"
	"path/filepath"
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
	fake.maxLength = 512
	fake.onRun = func(rows, maxLen int) { mem.run(rows, maxLen) }
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
