package ortenv

import "sync"

// sessionHeap counts the SessionHeap holders; the thresholds are raised
// while there is one.
var sessionHeap struct {
	sync.Mutex
	holders int
}

// SessionHeap lets glibc's heap serve and keep the large blocks that ONNX
// Runtime allocates and frees while a session is created, until release is
// called; call it around session creation only.
//
// Why: configureMalloc gives every block of 128 KiB or more a mapping of
// its own, unmapped when freed. Creating a CPU session packs every MatMul
// weight into a new block (MLAS's layout), and even a session from the
// graph cache does: ORT packs each weight again to find the stored packed
// form by its hash, then frees what it packed (session_state.cc,
// PrepackConstantInitializedTensors). On the DeBERTa-v3-large stand-in that
// is about 1.3 GB mapped, zeroed, filled and unmapped block by block, each
// page a fault, and page faults are what a virtual machine makes dear: on
// the 2-core host here they were two thirds of a cached session's 7 s,
// which took 2.2-3.1 s with the heap reusing one block's pages for the next
// (docs/benchmarks.md, "Start-up: the C heap during session creation").
//
// While a holder remains, blocks up to 32 MiB come from the heap and up to
// 64 MiB free at its top is kept; the last release puts configureMalloc's
// thresholds back and hands what the heap kept to the kernel (TrimMalloc),
// so a run's memory (what gpupool's CPU calibration reads) behaves as
// before. Where malloc is not glibc's it does nothing.
func SessionHeap() (release func()) {
	sessionHeap.Lock()
	if sessionHeap.holders == 0 {
		setSessionHeap(true)
	}
	sessionHeap.holders++
	sessionHeap.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			sessionHeap.Lock()
			defer sessionHeap.Unlock()
			if sessionHeap.holders--; sessionHeap.holders == 0 {
				setSessionHeap(false)
				// What the heap kept would otherwise serve the next
				// large blocks, resident or not, instead of mappings.
				TrimMalloc()
			}
		})
	}
}
