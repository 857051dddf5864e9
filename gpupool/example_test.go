package gpupool_test

import (
	"context"
	"fmt"

	"github.com/scorer/scorer/gpupool"
	"github.com/scorer/scorer/model"
)

// lengthEngine "scores" a pair by its token count. An Engine is all the
// pool needs of a device: model.Session in the scorer, a fake in tests.
type lengthEngine struct{}

func (lengthEngine) ScorePairs(_ context.Context, pairs []model.Pair) ([]float32, error) {
	out := make([]float32, len(pairs))
	for i, p := range pairs {
		out[i] = float32(len(p.IDs))
	}
	return out, nil
}

func (lengthEngine) Close() error { return nil }

// A CPU pool over a fake engine: one call's pairs are planned into batches
// of at most MaxBatchRows, sorted by length, run by whichever worker is
// idle, and their scores come back in the call's order.
func ExampleNew() {
	ctx := context.Background()
	pool, err := gpupool.New(ctx, func(gpupool.Device) (gpupool.Engine, error) { return lengthEngine{}, nil },
		gpupool.Mode(gpupool.ModeCPU), gpupool.CPUWorkers(2), gpupool.MaxBatchRows(2))
	if err != nil {
		panic(err)
	}
	defer pool.Close(ctx)

	pairs := []model.Pair{{IDs: []int32{7, 8, 9}}, {IDs: []int32{7}}, {IDs: []int32{7, 8}}, {IDs: []int32{7, 8, 9, 10}}}
	scores, err := pool.ScorePairs(ctx, pairs)
	if err != nil {
		panic(err)
	}
	st := pool.Stats()
	fmt.Println(scores)
	fmt.Println(pool.Devices()[0].Label(), st.Devices[0].Workers, "workers;", st.Pairs, "pairs in", st.Batches, "batches")
	// Output:
	// [3 1 2 4]
	// cpu 2 workers; 4 pairs in 2 batches
}
