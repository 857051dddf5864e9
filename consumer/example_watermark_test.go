package consumer_test

import (
	"fmt"

	"github.com/scorer/scorer/consumer"
)

// A Watermark per partition: offsets are tracked in fetch order and
// resolved in any order, and the offset to commit never passes one still in
// flight.
func ExampleWatermark() {
	w := consumer.NewWatermark()
	done := map[int64]func(){}
	for _, off := range []int64{10, 11, 12} {
		d, err := w.Track(off)
		if err != nil {
			panic(err)
		}
		done[off] = d
	}

	done[11]() // 11 finished first: 10 is still in flight
	_, ok := w.Committable()
	fmt.Println("after 11:", ok, "pending", w.Pending())

	done[10]() // 10 and 11 are done: commit up to 12, the next to read
	next, _ := w.Committable()
	fmt.Println("after 10: commit", next, "pending", w.Pending())

	done[12]()
	next, _ = w.Committable()
	fmt.Println("after 12: commit", next, "pending", w.Pending())
	// Output:
	// after 11: false pending 2
	// after 10: commit 12 pending 1
	// after 12: commit 13 pending 0
}
