//go:build linux && cgo

package ortenv

/*
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

// scorer_malloc_early is the result of scorer_malloc_setup run at program
// start, by scorer_malloc_at_start.
static int scorer_malloc_early;

// scorer_malloc_at_start makes the settings while the process has one
// thread: the C library runs the executable's constructors before main,
// which in a cgo binary is the Go runtime's entry, so before the runtime
// starts any thread (runc's nsenter relies on the same order).
__attribute__((constructor)) static void scorer_malloc_at_start(void) {
	scorer_malloc_early = scorer_malloc_setup(1, 128 << 10);
}

static int scorer_malloc_at_start_result(void) { return scorer_malloc_early; }

// scorer_malloc_thresholds sets glibc's mmap and trim thresholds; it
// returns 1 when both took, 0 when one did not, or -1 where the C library
// is not glibc.
static int scorer_malloc_thresholds(int mmap_threshold, int trim_threshold) {
#if defined(__GLIBC__) && defined(M_MMAP_THRESHOLD) && defined(M_TRIM_THRESHOLD)
	return mallopt(M_MMAP_THRESHOLD, mmap_threshold) == 1 && mallopt(M_TRIM_THRESHOLD, trim_threshold) == 1;
#else
	(void)mmap_threshold;
	(void)trim_threshold;
	return -1;
#endif
}

// scorer_malloc_maps reports whether a block of size bytes gets a mapping
// of its own (1) rather than heap memory (0), or -1 where it cannot tell:
// glibc counts mapped blocks in mallinfo2's hblks. *free is the heap's
// free memory before, which may serve a block whatever the threshold.
static int scorer_malloc_maps(size_t size, size_t *free_bytes) {
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 33))
	struct mallinfo2 mi = mallinfo2();
	*free_bytes = mi.fordblks;
	size_t before = mi.hblks;
	void *p = malloc(size);
	if (p == NULL)
		return -1;
	size_t after = mallinfo2().hblks;
	free(p);
	return after > before;
#else
	(void)size;
	*free_bytes = 0;
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

// scorer_malloc_arenas counts glibc's malloc arenas, which malloc_info(3)
// reports as one <heap nr="..."> element each, or returns -1.
static int scorer_malloc_arenas(void) {
#if defined(__GLIBC__)
	char *buf = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);
	if (f == NULL)
		return -1;
	int ok = malloc_info(0, f) == 0;
	if (fclose(f) != 0)
		ok = 0;
	int n = 0;
	for (const char *p = buf; ok && (p = strstr(p, "<heap nr=")) != NULL; p++)
		n++;
	free(buf);
	return ok ? n : -1;
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
// faults). Session creation is where it did cost, a mapping per packed
// weight, so SessionHeap lifts both thresholds for its duration.
//
// When: before any thread but the first has called malloc. A thread takes
// an arena at its first allocation and keeps it; a cap set later makes no
// new arenas but retires none either, and spreads new threads over those
// that exist. Go's runtime allocates from C on each thread that starts
// another (cgo's thread start), so a Go program already has four or five
// arenas when main runs (two cores here), and the cap InitRuntime used to
// set left ORT's threads spread over all of them
// (TestMallocOneArenaForEveryThread). scorer_malloc_at_start makes the
// settings as the process starts, in every binary that links this package
// (the scorer, its tests), before the Go runtime exists. MALLOC_ARENA_MAX
// and MALLOC_MMAP_THRESHOLD_ in the environment would do the same, but only
// for a process started with them: a bare binary would have to re-execute
// itself to get them, and would hand them on to every process it starts.
// The settings here override those variables.
//
// configureMalloc reports whether the settings took at start, and makes
// them again (the same values) should the constructor not have run.
func configureMalloc() bool {
	early := C.scorer_malloc_at_start_result() == 1
	return C.scorer_malloc_setup(1, mmapThreshold) == 1 && early
}

// mmapThreshold is the fixed mmap threshold of configureMalloc, which is
// also glibc's default trim threshold (M_TRIM_THRESHOLD).
const mmapThreshold = 128 << 10

// The thresholds while a session is created (SessionHeap): blocks up to
// 32 MiB (glibc's largest mmap threshold on 64-bit; the largest weight
// ORT packs in the DeBERTa-v3-large stand-in is 16 MiB) come from the
// heap, and up to 64 MiB free at its top stays there for the next one.
const (
	sessionMmapThreshold = 32 << 20
	sessionTrimThreshold = 64 << 20
)

// setSessionHeap sets the thresholds of SessionHeap (on) or back to
// configureMalloc's (off). A refusal leaves the heap as it was, only slower
// to create sessions in, so it is not reported (TestSessionHeapKeepsLargeBlocksWhileHeld
// checks that glibc takes them).
func setSessionHeap(on bool) {
	if on {
		C.scorer_malloc_thresholds(sessionMmapThreshold, sessionTrimThreshold)
		return
	}
	C.scorer_malloc_thresholds(mmapThreshold, mmapThreshold)
}

// mallocMaps reports whether malloc gives a block of size bytes a mapping
// of its own, and how much free heap memory there was before (which may
// serve the block whatever the threshold); ok is false where it cannot
// tell.
func mallocMaps(size int) (mapped bool, free int, ok bool) {
	var f C.size_t
	r := C.scorer_malloc_maps(C.size_t(size), &f)
	return r == 1, int(f), r >= 0
}

// TrimMalloc returns the C heap's free pages to the kernel: after a session
// is created the protobuf copy of the model is free but still resident.
func TrimMalloc() { C.scorer_malloc_trim() }

// MallocArenas is how many malloc arenas glibc has made in this process
// (arenas are never freed), or false where it cannot tell: one, with the
// settings above, however many threads allocate (model's
// TestMallocOneArenaForEveryThread).
func MallocArenas() (int, bool) {
	n := int(C.scorer_malloc_arenas())
	return n, n >= 0
}
