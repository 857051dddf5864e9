package doctor

import (
	"context"
	"fmt"
	"time"

	"github.com/scorer/scorer/internal/measure"
	"github.com/scorer/scorer/model"
)

// DefaultBudget is Options.Budget's default: within it, on 2 cores with
// production-size DeBERTa-v3 in fp16 the doctor scores a few of the
// sample's 36 pairs on the CPU and skips the throughput run.
const DefaultBudget = 15 * time.Second

// budget is what is left of Options.Budget, and where cuts are said.
type budget struct {
	deadline time.Time
	skipped  *[]string
}

func (b *budget) left() time.Duration { return time.Until(b.deadline) }

func (b *budget) skip(format string, args ...any) {
	*b.skipped = append(*b.skipped, fmt.Sprintf(format, args...))
}

// chunkPairs is how many pairs the sample scores at a time: one sentence
// against every label, as a consumer's smallest call would.
func chunkPairs(o Options) int { return max(1, len(o.Config.LabelConfig().Hypotheses())) }

// scoreSample scores the first pair whatever the budget (it is what proves
// the device works), then the rest a chunk at a time, each only while the
// time per pair so far says it ends within the budget's share, left. It
// returns the scores of the pairs it got to and the time per pair.
func scoreSample(ctx context.Context, scorePairs func(context.Context, []model.Pair) ([]float32, error), pairs []model.Pair, chunk int,
	left func() time.Duration) ([]float32, time.Duration, error) {
	next := func(done int, elapsed time.Duration) int {
		if done == 0 {
			return 1
		}
		n := min(chunk, len(pairs)-done)
		if elapsed/time.Duration(done)*time.Duration(n) > left() {
			return 0
		}
		return n
	}
	run, err := measure.Chunks(ctx, pairs, next, scorePairs)
	if err != nil {
		return run.Results, 0, err
	}
	return run.Results, run.Wall / time.Duration(max(1, len(run.Results))), nil
}
