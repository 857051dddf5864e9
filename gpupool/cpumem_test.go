package gpupool

import (
	"slices"
	"sync"
	"testing"
)

func withProcessMemory(m processMemory) Option { return optFunc(func(c *cfg) { c.procMem = m }) }

// fakeMemory is a process whose resident memory is rss plus what the batch
// running now needs under a transformer-like model; the peak follows it.
type fakeMemory struct {
	mu        sync.Mutex
	rss, peak uint64
	cost      func(rows, length int) uint64
}

func (m *fakeMemory) resetPeak() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.peak = m.rss
	return nil
}

func (m *fakeMemory) usage() (uint64, uint64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.rss, m.peak, nil
}

func (m *fakeMemory) run(rows, length int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.peak = max(m.peak, m.rss+m.cost(rows, length))
}

// debertaCPU is a production-size DeBERTa's measured cost per batch on the CPU
// (docs/benchmarks.md): a few MB, ~40 KB per token, ~450 B per token·len.
func debertaCPU(rows, length int) uint64 {
	r, l := uint64(rows), uint64(length)
	return 3<<20 + 40_000*r*l + 450*r*l*l
}

// TestCPUMemoryCapsLongBatches calibrates a CPU engine whose memory grows
// like DeBERTa's and scores ordinary and ~500-token pairs: ordinary pairs
// still get full 16-row batches, long ones are cut so that no batch needs
// more than a full batch of 128-token pairs (the default BatchBytes), and a
// Limit splits what is left of it between the workers. Without CPUMemory
// the same long pairs run 16 to a batch, about seven times the memory.
func TestCPUMemoryCapsLongBatches(t *testing.T) {
	lens := slices.Repeat([]int{40}, 64)
	lens = append(lens, slices.Repeat([]int{500}, 24)...)
	pairs := makePairs(lens)

	run := func(t *testing.T, opts ...Option) (*Pool, *fakeMemory, [][2]int) {
		mem := &fakeMemory{rss: 2 << 30, cost: debertaCPU}
		var mu sync.Mutex
		var batches [][2]int
		calibrated := false
		eng := &fakeEngine{maxLength: 512, onRun: func(rows, maxLen int) {
			mem.run(rows, maxLen)
			mu.Lock()
			defer mu.Unlock()
			if calibrated {
				batches = append(batches, [2]int{rows, maxLen})
			}
		}}
		f := newFakeFactory(map[string]*fakeEngine{"cpu": eng})
		p, err := New(testCtx(t), f.factory, append([]Option{Mode(ModeCPU), CPUWorkers(2), MaxBatchRows(16),
			MaxBatchTokens(16384), withProcessMemory(mem)}, opts...)...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = p.Close(testCtx(t)) })
		mu.Lock()
		calibrated = true
		mu.Unlock()
		mustScore(t, p, pairs)
		mu.Lock()
		defer mu.Unlock()
		return p, mem, batches
	}
	longRows := func(batches [][2]int) (n int) {
		for _, b := range batches {
			if b[1] == 500 {
				n = max(n, b[0])
			}
		}
		return n
	}

	t.Run("no memory model", func(t *testing.T) {
		_, _, batches := run(t)
		if got := longRows(batches); got != 16 {
			t.Errorf("long pairs ran %d to a batch without CPUMemory, want 16 (the rows cap)", got)
		}
	})

	t.Run("default batch bytes", func(t *testing.T) {
		p, _, batches := run(t, CPUMemory(CPUMemoryConfig{}))
		st := p.Stats().Devices[0]
		ref := float64(debertaCPU(16, 128))
		if st.Memory.BudgetBytes < ref || st.Memory.BudgetBytes > 1.25*ref {
			t.Errorf("BatchBytes %.0f, want the cost of 16 rows of 128 tokens (%.0f) plus the 10%% margin", st.Memory.BudgetBytes, ref)
		}
		if st.Memory.BaselineBytes != 2<<30 {
			t.Errorf("BaselineBytes %d, want the resident size after calibration (%d)", st.Memory.BaselineBytes, 2<<30)
		}
		for _, b := range batches {
			if c := float64(debertaCPU(b[0], b[1])); c > st.Memory.BudgetBytes {
				t.Errorf("batch %d×%d needs %.0f bytes, above BatchBytes %.0f", b[0], b[1], c, st.Memory.BudgetBytes)
			}
			if b[1] == 40 && b[0] != 16 && len(batches) > 0 {
				// 64 short pairs: four full batches.
				t.Errorf("ordinary pairs ran %d to a batch, want 16", b[0])
			}
		}
		if got := longRows(batches); got < 1 || got > 2 {
			t.Errorf("long pairs ran up to %d to a batch, want 1 or 2 (rows fall with len²)", got)
		}
	})

	t.Run("limit shared by workers", func(t *testing.T) {
		room := uint64(debertaCPU(1, 500)) * 3 // three long rows per worker
		limit := uint64(2<<30) + 1<<30 + 2*room
		p, _, batches := run(t, CPUMemory(CPUMemoryConfig{Limit: limit, Reserve: 1 << 30, BatchBytes: 1 << 40}))
		st := p.Stats().Devices[0]
		if d := st.Memory.BudgetBytes - float64(room); d > 1 || d < -1 {
			t.Errorf("BatchBytes %.0f, want (limit − baseline − reserve) / 2 workers = %d", st.Memory.BudgetBytes, room)
		}
		for _, b := range batches {
			if c := float64(debertaCPU(b[0], b[1])); c > st.Memory.BudgetBytes {
				t.Errorf("batch %d×%d needs %.0f bytes, above one worker's share %.0f", b[0], b[1], c, st.Memory.BudgetBytes)
			}
		}
		if got := longRows(batches); got != 2 {
			t.Errorf("long pairs ran up to %d to a batch, want 2 (3 rows' cost less the 10%% margin)", got)
		}
	})
}
