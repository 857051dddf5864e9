package doctor

import (
	"context"
	"fmt"
	"time"

	"github.com/scorer/scorer/gpupool"
	"github.com/scorer/scorer/internal/measure"
	"github.com/scorer/scorer/model"
)

// throughput scores the sample repeatedly for up to d (less when the
// budget has less left) in calls of the size a consumer batch produces (8×
// the sample, fewer pairs when the time per pair says such a call would
// take more than half of d, but never under one chunk), and records pairs/s
// and the batch shapes used. When what is left of the budget cannot hold a
// call of one chunk the run is skipped and the report says so. A call
// still going when the budget ends (or at twice d, if later) is cancelled
// and not counted.
func throughput(ctx context.Context, pool *gpupool.Pool, pairs []model.Pair, chunk int, d, perPair time.Duration, b *budget, c *DeviceCheck) {
	left := b.left()
	d = min(d, left)
	stop := max(2*d, left)
	least := min(chunk, len(pairs))
	if d <= 0 || perPair*time.Duration(least) > left {
		b.skip("%s: throughput run skipped: %.1f s left of the budget, %.2f s a pair", c.Device, max(0, left.Seconds()), perPair.Seconds())
		return
	}
	size := 8 * len(pairs)
	if perPair > 0 {
		// At least one chunk, which the budget holds, even past d.
		size = max(least, min(size, int(d/2/perPair)))
	}
	call := make([]model.Pair, 0, size)
	for len(call) < size {
		call = append(call, pairs[:min(len(pairs), size-len(call))]...)
	}
	run, cancel := context.WithTimeout(ctx, stop)
	defer cancel()
	before := pool.Stats()
	calls, elapsed, err := measure.Repeat(run, d, 0, func(ctx context.Context) error {
		_, err := pool.ScorePairs(ctx, call)
		return err
	})
	// A call the run's time ended mid-way is not counted, and no problem.
	if err != nil && (run.Err() == nil || ctx.Err() != nil) {
		c.OK, c.Problem = false, problemOf(fmt.Errorf("throughput run: %w", err))
		return
	}
	n := len(calls) * len(call)
	if n == 0 {
		b.skip("%s: throughput run: no call of %d pairs ended within %.1f s", c.Device, len(call), stop.Seconds())
		return
	}
	after := pool.Stats()
	c.PairsPerSecond = float64(n) / elapsed.Seconds()
	c.Batches = after.Batches - before.Batches
	if c.Batches > 0 {
		c.MeanBatchRows = float64(after.Pairs-before.Pairs) / float64(c.Batches)
	}
	if pt := after.PaddedTokens - before.PaddedTokens; pt > 0 {
		c.Padding = float64(after.RealTokens-before.RealTokens) / float64(pt)
	}
}
