//go:build linux && cgo

package model

/*
#include <malloc.h>

// scorer_malloc_arenas caps glibc's malloc arenas; it returns mallopt's
// result (1 on success), or -1 where the C library is not glibc.
static int scorer_malloc_arenas(int n) {
#if defined(__GLIBC__) && defined(M_ARENA_MAX)
	return mallopt(M_ARENA_MAX, n);
#else
	(void)n;
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

// singleMallocArena makes every thread allocate from one glibc arena.
//
// Why: glibc gives threads their own arenas (up to 8 per core) and keeps
// what is freed in each for that arena's later use. Go runs each cgo call on
// whichever OS thread is free, so ORT's session creation (which briefly
// holds the ONNX file's protobuf beside the weights: about twice the model)
// and later runs land on different threads and arenas; memory one freed
// cannot serve the other, and a production-size DeBERTa process peaked at
// 2.5 GB in one run and 4.6 GB in the next on the same input. With one
// arena the heap is reused whichever thread allocates. ORT's own CPU arena
// serves tensors, so malloc is called rarely and the shared lock costs
// nothing measurable (make bench; docs/benchmarks.md, production size).
func singleMallocArena() bool { return C.scorer_malloc_arenas(1) == 1 }

// trimMalloc returns the C heap's free pages to the kernel: after a session
// is created the protobuf copy of the model is free but still resident.
func trimMalloc() { C.scorer_malloc_trim() }
