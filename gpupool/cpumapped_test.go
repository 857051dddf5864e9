package gpupool

import "testing"

// mappedMemory is a fakeMemory whose engine maps weights it has not read:
// the first run faults them in (resident from then on), as a session
// loaded from GRAPH_CACHE does with its prepacked weights.
type mappedMemory struct {
	*fakeMemory
	unread uint64
}

func (m *mappedMemory) mappedUnread() (uint64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.unread, nil
}

func (m *mappedMemory) run(rows, length int) {
	m.mu.Lock()
	m.rss += m.unread
	m.unread = 0
	m.mu.Unlock()
	m.fakeMemory.run(rows, length)
}

// TestCPUBaselineCountsMappedWeights: the budget's baseline is the same
// whether or not the weights were read before it was taken. A cold start
// measures (its runs fault the mapped weights in), a warm one takes the
// kept fit and runs nothing, so its weights are still only mapped; both
// must count them, or the warm start's workers each get a share of memory
// the weights will take at the first long batches.
func TestCPUBaselineCountsMappedWeights(t *testing.T) {
	const rest, weights = 1 << 30, 1400 << 20 // the production stand-in's resident weights at /readyz
	dir := t.TempDir()
	// No per-batch cap: each worker's share of the limit is the budget.
	mc := CPUMemoryConfig{CacheDir: dir, Limit: 4 << 30, Reserve: 512 << 20, BatchBytes: 1 << 40}
	start := func(t *testing.T) (DeviceStats, int) {
		t.Helper()
		mem := &mappedMemory{fakeMemory: &fakeMemory{rss: rest, cost: debertaCPU}, unread: weights}
		fake := &fakeEngine{}
		return startCPUPoolOn(t, keyedEngine{fakeEngine: fake, key: "model=a ort=1.30.0 intra_op=1"}, fake, mem, mem.run, mc)
	}
	cold, runs := start(t)
	if runs == 0 {
		t.Fatal("the first start ran no calibration batch")
	}
	warm, runs := start(t)
	if runs != 0 {
		t.Fatalf("the second start ran %d batches, want none (the kept fit)", runs)
	}
	if cold.Memory.BaselineBytes != rest+weights {
		t.Errorf("cold start's baseline %d bytes, want %d (the weights read by its runs)", cold.Memory.BaselineBytes, rest+weights)
	}
	if warm.Memory.BaselineBytes != cold.Memory.BaselineBytes || warm.Memory.BudgetBytes != cold.Memory.BudgetBytes {
		t.Errorf("warm start: baseline %d bytes, batch budget %.0f; cold start: %d, %.0f: want the same (weights mapped, not yet read, count)",
			warm.Memory.BaselineBytes, warm.Memory.BudgetBytes, cold.Memory.BaselineBytes, cold.Memory.BudgetBytes)
	}
}
