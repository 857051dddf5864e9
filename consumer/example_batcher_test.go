package consumer_test

import (
	"fmt"
	"time"

	"github.com/scorer/scorer/consumer"
)

// A Batcher is a passive policy: its owner adds messages, flushes when Add
// says so (or WouldOverflow warns that the next would break the byte
// bound), and arms its timer with UntilNext.
func ExampleBatcher() {
	b := consumer.NewBatcher(consumer.BatchPolicy{MaxMessages: 3, MaxBytes: 10, MaxWait: 200 * time.Millisecond},
		func(m string) int { return len(m) })

	for _, m := range []string{"ab", "cd", "ef", "ghijkl", "mnopq"} {
		if b.WouldOverflow(m) {
			batch, why := b.Flush()
			fmt.Println(batch, why)
		}
		if b.Add(m) {
			batch, why := b.Flush()
			fmt.Println(batch, why)
		}
	}
	// What is left waits for the timer (at most MaxWait) or a forced flush.
	fmt.Println(b.UntilNext(time.Now()) > 0, b.Len())
	batch, why := b.Flush()
	fmt.Println(batch, why)
	// Output:
	// [ab cd ef] count
	// [ghijkl] bytes
	// true 1
	// [mnopq] forced
}
