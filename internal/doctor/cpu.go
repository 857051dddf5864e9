package doctor

import (
	"context"
	"fmt"
	"time"

	"github.com/scorer/scorer/gpupool"
	"github.com/scorer/scorer/internal/config"
	"github.com/scorer/scorer/internal/scoring"
	"github.com/scorer/scorer/model"
)

// checkCPU scores the sample on the CPU pool the service builds with
// DEVICE=cpu (the CPU batch shape, workers and threads, the memory budget:
// scoring.Open from the same configuration) and measures its
// throughput. When a GPU is the path (path false) the CPU is only the
// parity reference: it is skipped when less of the budget is left than
// opening a GPU's pool took (opening, a floor on what opening the CPU's
// costs), and otherwise scores as much of the sample as the budget allows.
func checkCPU(ctx context.Context, rt *scoring.Runtime, m *model.Model, o Options, pairs []model.Pair, b *budget, path bool, opening time.Duration) DeviceCheck {
	c := DeviceCheck{Device: "cpu"}
	if left := b.left(); !path && (left <= 0 || left < opening) {
		c.Skipped = fmt.Sprintf("%.1f s of the %v budget left after the GPU checks; opening a session took %.1f s there", max(0, left.Seconds()), o.Budget, opening.Seconds())
		b.skip("cpu: not run (%s): no parity against the CPU", c.Skipped)
		return c
	}
	cpu := o.Config
	cpu.Device = string(gpupool.ModeCPU)
	host := config.DetectHost()
	mem, _, _ := cpu.CPUMemory(host)
	// Measuring the CPU's memory per batch takes 11 s of production
	// DeBERTa-v3 in fp16 on 2 cores; the service does it at its first start
	// and keeps it (CPU_CALIBRATION_CACHE), the doctor only reads it.
	stack, err := scoring.Open(ctx, cpu, o.Log, nil, scoring.OnRuntime(rt), scoring.WithModel(m), scoring.NoCache(),
		scoring.CPUCalibrationCachedOnly())
	if err != nil {
		c.Problem = problemOf(err)
		return c
	}
	defer stack.Close(context.Background())
	pool := stack.Pool
	if st := pool.Stats(); mem != nil && len(st.Devices) > 0 && st.Devices[0].Memory.BudgetBytes == 0 {
		b.skip("cpu: memory per batch not measured: none kept in CPU_CALIBRATION_CACHE (the service measures and keeps it at its first start); this pool's batches are bounded by rows and tokens only")
	}
	st := pool.Stats()
	c.MaxBatchTokens, c.MaxBatchRows = pool.BatchShape()
	if len(st.Devices) > 0 {
		c.Workers = st.Devices[0].Workers
	}
	_, c.IntraOpThreads = cpu.CPUPlan(host)
	scores, perPair, err := scoreSample(ctx, pool.ScorePairs, pairs, chunkPairs(o), b.left)
	if err != nil {
		c.Problem = problemOf(err)
		return c
	}
	c.OK, c.scores, c.SamplePairs = true, scores, len(scores)
	if len(scores) < len(pairs) {
		b.skip("cpu: scored %d of the sample's %d pairs (%.2f s a pair; the budget had %.1f s left)", len(scores), len(pairs),
			perPair.Seconds(), max(0, b.left().Seconds()))
	}
	throughput(ctx, pool, pairs, chunkPairs(o), o.Duration, perPair, b, &c)
	return c
}
