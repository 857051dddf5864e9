package bench

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"

	"github.com/scorer/scorer/internal/config"
)

// benchLarge is the large section: the shapes and int8 sections on
// --large-model, a smaller sweep (--large-shape-rows, the largest
// --shape-tokens, one round) timed as "large". The stand-in is opt-in and
// slow: its rows follow --skip large alone, so they can be run without the
// small models' sections; revision is not run on it (its cache behaviour
// is the small models').
func benchLarge(ctx context.Context, b *benchRun, _ *folder) error {
	if b.bf.largeModel == "" {
		return nil
	}
	dir, err := config.ResolvePath(b.bf.largeModel)
	if err != nil {
		return fmt.Errorf("bench: model dir: %w", err)
	}
	// At ~11 pairs/s fp32 the full sweep would take an hour.
	rows, err := intList(b.bf.largeRows)
	if err != nil {
		return fmt.Errorf("bench: --large-shape-rows: %w", err)
	}
	f, err := b.perfFolder(dir, true, rows, []int{slices.Max(b.tokens)})
	if err == nil {
		err = benchShapes(ctx, b, f)
	}
	if err == nil {
		err = benchInt8(ctx, b, f)
	}
	if err != nil {
		return fmt.Errorf("bench: %s: %w", filepath.Base(dir), err)
	}
	b.rep.Perf = append(b.rep.Perf, *f.pr)
	return nil
}
