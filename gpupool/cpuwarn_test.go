package gpupool

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/rs/zerolog"
)

// standinFit is the CPU memory fit calibration measured for the
// production-size DeBERTa-v3 stand-in in fp32 (issue 45, item 6: a start
// on 2 cores): about 2 MB per batch and 577 bytes per token·len, nothing
// linear in the tokens. With it a batch of 16 rows of 128 tokens (the
// default BatchBytes) models exactly what one row of 512 tokens does
// (16·128² = 512²).
func standinFit(rows, length int) uint64 {
	r, l := uint64(rows), uint64(length)
	return 1_987_232 + 577*r*l*l
}

// cpuBudgetLog starts a 2-worker CPU pool with 16-row batches whose engine
// (maximum length maxLen) costs standinFit, calibrated against mc, and
// returns the pool's log lines as decoded JSON.
func cpuBudgetLog(t *testing.T, maxLen int, rss uint64, mc CPUMemoryConfig) (DeviceStats, []map[string]any) {
	t.Helper()
	mem := &fakeMemory{rss: rss, cost: standinFit}
	eng := &fakeEngine{maxLength: maxLen, onRun: mem.run}
	f := newFakeFactory(map[string]*fakeEngine{"cpu": eng})
	var logs bytes.Buffer
	p, err := New(testCtx(t), f.factory, Mode(ModeCPU), CPUWorkers(2), MaxBatchRows(16), MaxBatchTokens(16384),
		withProcessMemory(mem), CPUMemory(mc), Calibrate(Calibration{MaxLen: maxLen}), Logger(zerolog.New(&logs)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close(testCtx(t)) })
	st := p.Stats().Devices[0]
	var lines []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("log line %q: %v", l, err)
		}
		lines = append(lines, m)
	}
	return st, lines
}

// budgetLines are the lines among lines that say a pair of the maximum
// length does not fit a batch: what the budget, or the cap, leaves.
func budgetLines(lines []map[string]any) []map[string]any {
	var out []map[string]any
	for _, m := range lines {
		msg, _ := m["message"].(string)
		if strings.Contains(msg, "maximum length") {
			out = append(out, m)
		}
	}
	return out
}

// TestCPUBudgetWarningSaysWhatBinds starts the CPU pool as the production
// stand-in started on a 23 GiB machine (issue 45, item 6): a 25 GB limit
// split between 2 workers leaves each about 10 GB, hundreds of times what
// one pair of 512 tokens needs, so nothing may warn that the memory budget
// is short. A per-batch cap (BatchBytes) below one maximum-length pair is
// said as what it is, at info level: such pairs run alone, above the cap,
// within the budget. Only a share of the limit below one pair warns about
// the memory budget.
func TestCPUBudgetWarningSaysWhatBinds(t *testing.T) {
	const (
		limit   = 25_276_026_880
		reserve = 2_829_592_576
		rss     = 1_447_223_296
	)
	t.Run("the stand-in on 25 GB", func(t *testing.T) {
		st, lines := cpuBudgetLog(t, 512, rss, CPUMemoryConfig{Limit: limit, Reserve: reserve})
		if got := st.Memory.MaxRows(512, st.Memory.BudgetBytes); got < 1 {
			t.Errorf("MaxRows(512, %.0f) = %d: a pair that needs exactly the cap (%.0f) does not fit it", st.Memory.BudgetBytes, got, st.Memory.Bytes(1, 512))
		}
		for _, m := range budgetLines(lines) {
			t.Errorf("logged %q (%v) though one pair of 512 tokens fits both the cap and each worker's share of the limit", m["message"], m["level"])
		}
	})
	t.Run("cap below one pair, budget ample", func(t *testing.T) {
		// 1024 tokens: one pair models 4× the 16×128 cap, still far below
		// each worker's ~10 GB.
		st, lines := cpuBudgetLog(t, 1024, rss, CPUMemoryConfig{Limit: limit, Reserve: reserve})
		onePair := st.Memory.Bytes(1, 1024)
		if onePair <= st.Memory.BudgetBytes {
			t.Fatalf("one pair of 1024 tokens models %.0f bytes, within the cap %.0f: the case is not exercised", onePair, st.Memory.BudgetBytes)
		}
		got := budgetLines(lines)
		if len(got) != 1 {
			t.Fatalf("%d lines about the maximum length, want 1: %v", len(got), got)
		}
		m := got[0]
		msg, _ := m["message"].(string)
		if m["level"] != "info" || strings.Contains(msg, "memory budget leaves less") || !strings.Contains(msg, "CPU_MAX_BATCH_BYTES") {
			t.Errorf("logged %v %q, want an info line naming CPU_MAX_BATCH_BYTES's cap, not the memory budget", m["level"], msg)
		}
		share, _ := m["share_per_worker_bytes"].(float64)
		if want := float64(limit-reserve-rss) / 2; share != want {
			t.Errorf("share_per_worker_bytes = %v, want (limit - baseline - reserve) / workers = %.0f", m["share_per_worker_bytes"], want)
		}
		if cap, _ := m["batch_cap_bytes"].(float64); cap != st.Memory.BudgetBytes {
			t.Errorf("batch_cap_bytes = %v, want the cap batches are cut to (%.0f)", m["batch_cap_bytes"], st.Memory.BudgetBytes)
		}
	})
	t.Run("share below one pair", func(t *testing.T) {
		// Each worker's share: 100 MB, below one 512-token pair (~167 MB).
		small := uint64(rss + reserve + 2*100_000_000)
		st, lines := cpuBudgetLog(t, 512, rss, CPUMemoryConfig{Limit: small, Reserve: reserve})
		got := budgetLines(lines)
		if len(got) != 1 {
			t.Fatalf("%d lines about the maximum length, want 1: %v", len(got), got)
		}
		m := got[0]
		msg, _ := m["message"].(string)
		if m["level"] != "warn" || !strings.Contains(msg, "memory budget leaves less per worker") {
			t.Errorf("logged %v %q, want the warning that the memory budget is short", m["level"], msg)
		}
		if st.Memory.BudgetBytes >= st.Memory.Bytes(1, 512) {
			t.Errorf("budget %.0f holds one 512-token pair (%.0f): the case is not exercised", st.Memory.BudgetBytes, st.Memory.Bytes(1, 512))
		}
	})
}

// TestMaxRowsOfExactlyTheRoom: a batch whose modelled memory is the room
// fits it. The production stand-in's CPU fit (as calibrated at a start,
// issue 45 item 6: nothing linear in the tokens) models one row of 512
// tokens exactly as 16 rows of 128, the default per-batch cap, yet
// rounding put MaxRows at 0 and the start warned that the budget was
// short.
func TestMaxRowsOfExactlyTheRoom(t *testing.T) {
	e := MemoryModel{Base: 1987232.4776119404, PerTokenLen: 576.5338015803336, Calibrated: true}
	room := e.Bytes(16, 128)
	if got := e.MaxRows(512, room); got != 1 {
		t.Errorf("MaxRows(512, Bytes(16, 128) = %.0f) = %d, want 1: one row of 512 models %.0f bytes", room, got, e.Bytes(1, 512))
	}
	if got := e.MaxRows(128, room); got != 16 {
		t.Errorf("MaxRows(128, Bytes(16, 128)) = %d, want 16", got)
	}
	if got := e.MaxRows(513, room); got != 0 {
		t.Errorf("MaxRows(513, Bytes(16, 128)) = %d, want 0: one row of 513 needs more than the room", got)
	}
}
