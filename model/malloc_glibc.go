//go:build linux && cgo

package model

/*
#include <malloc.h>

// scorer_malloc_setup caps glibc's malloc arenas at arenas and fixes its
// mmap threshold at mmap_threshold bytes; it returns 1 when both took, 0
// when one did not, or -1 where the C library is not glibc.
static int scorer_malloc_setup(int arenas, int mmap_threshold) {
#if defined(__GLIBC__) && defined(M_ARENA_MAX) && defined(M_MMAP_THRESHOLD)
	return mallopt(M_ARENA_MAX, arenas) == 1 && mallopt(M_MMAP_THRESHOLD, mmap_threshold) == 1;
#else
	(void)arenas;
	(void)mmap_threshold;
	return -1;
#endif
}

// scorer_malloc_trim hands free heap pages back to the kernel (glibc), or
// does nothing (-1) elsewhere.
static int scorer_malloc_trim(void) {
#if defined(__GLIBC__)
	return malloc_trim(0);
#else
	return -1;
#endif
}
*/
import "C"

// configureMalloc makes every thread allocate from one glibc arena and
// gives every block of 128 KiB or more its own mapping, released when it is
// freed.
//
// One arena: glibc gives threads their own arenas (up to 8 per core) and
// keeps what is freed in each for that arena's later use. Go runs each cgo
// call on whichever OS thread is free, so ORT's session creation (which
// briefly holds the ONNX file's protobuf beside the weights: about twice
// the model) and later runs land on different threads and arenas; memory
// one freed cannot serve the other, and a production-size DeBERTa process
// peaked at 2.5 GB in one run and 4.6 GB in the next on the same input.
// With one arena the heap is reused whichever thread allocates. ORT's own
// CPU arena serves tensors, so malloc is called rarely and the shared lock
// costs nothing measurable (make bench; docs/benchmarks.md, production
// size).
//
// A fixed mmap threshold: glibc's default one moves. Freeing a mapped
// block raises it to that block's size, so the next blocks of that size
// come from the heap instead, where pages an earlier run left resident
// serve them without the resident size growing. What a run adds to the
// resident size then depends on the runs before it: gpupool's CPU
// calibration read one 512-token row of the tiny DeBERTa-v3 at 2.3 to
// 8.7 MB in some runs against about 15 MB in the rest, and a fit on such a
// reading lost its quadratic term, so long batches were under-planned.
// With the threshold fixed at glibc's own starting value the same row reads
// 14.5 to 15.5 MB in every run (gpupool's TestCPUCalibrationReadingRepeats).
// It costs nothing measurable in steady state: ORT's CPU arena keeps its
// regions between runs, so nothing is mapped per batch (BenchmarkScorePairs
// on the tiny DeBERTa-v3: the same pairs/s within noise, the same page
// faults).
func configureMalloc() bool { return C.scorer_malloc_setup(1, 128<<10) == 1 }

// trimMalloc returns the C heap's free pages to the kernel: after a session
// is created the protobuf copy of the model is free but still resident.
func trimMalloc() { C.scorer_malloc_trim() }
