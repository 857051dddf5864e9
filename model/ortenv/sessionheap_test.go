package ortenv

import "testing"

// TestSessionHeapKeepsLargeBlocksWhileHeld: the large blocks ORT packs
// weights into come from the heap while a session is created and get
// mappings of their own again once the last holder is done, so runs keep
// configureMalloc's behaviour.
func TestSessionHeapKeepsLargeBlocksWhileHeld(t *testing.T) {
	// The packed attention and feed-forward weights of DeBERTa-v3-large.
	sizes := []int{4 << 20, 16 << 20}
	maps := func(when string, want bool) {
		t.Helper()
		for _, size := range sizes {
			mapped, free, ok := mallocMaps(size)
			if !ok {
				t.Skip("malloc is not glibc's (2.33 or later): nothing to set")
			}
			if want && !mapped && free >= size {
				t.Skipf("%s: the heap has %d bytes free, which may serve a block of %d whatever the threshold", when, free, size)
			}
			if mapped != want {
				t.Errorf("%s: a block of %d bytes mapped of its own = %t, want %t (%d bytes free in the heap before)", when, size, mapped, want, free)
			}
		}
	}
	maps("before SessionHeap", true)
	release := SessionHeap()
	inner := SessionHeap()
	maps("while held twice", false)
	inner()
	inner() // a second call of one release counts once
	maps("while one holder remains", false)
	release()
	maps("after the last release", true)
}
