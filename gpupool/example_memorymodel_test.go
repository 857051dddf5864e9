package gpupool_test

import (
	"fmt"

	"github.com/scorer/scorer/gpupool"
)

// A GPU's memory model as a pool reports it (DeviceStats.Memory), with
// round figures: what a batch costs, the room one batch has in the pool's
// budget, and how many rows of each length fit there; the planner cuts
// batches to those rows and admission reserves Bytes for each.
func ExampleMemoryModel() {
	const MiB = 1 << 20
	mm := gpupool.MemoryModel{
		Base: 64 * MiB, PerRow: 1 * MiB, PerToken: 16 << 10, PerTokenLen: 200, Calibrated: true,
		WeightBytes: 900 * MiB, BesideArenaBytes: 700 * MiB, HeadroomBytes: 256 * MiB,
		BudgetBytes: 8 << 30,
	}
	fmt.Printf("64×128 needs %.0f MiB\n", mm.Bytes(64, 128)/MiB)
	room := mm.Room(mm.BudgetBytes)
	fmt.Printf("room for one batch: %.0f MiB\n", room/MiB)
	for _, l := range []int{128, 512} {
		fmt.Printf("rows of %d tokens that fit: %d\n", l, mm.MaxRows(l, room))
	}
	// Output:
	// 64×128 needs 502 MiB
	// room for one batch: 6336 MiB
	// rows of 128 tokens that fit: 929
	// rows of 512 tokens that fit: 96
}
