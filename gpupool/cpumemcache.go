package gpupool

import (
	"fmt"
	"os"
	"runtime"
	"strings"

	"github.com/scorer/scorer/model/ortenv"
)

// cpuFit is a CPU engine's calibrated memory per batch: bytes ≈ Base +
// PerToken·rows·len + PerTokenLen·rows·len².
type cpuFit struct {
	Base        float64 `json:"base_bytes"`
	PerToken    float64 `json:"bytes_per_token"`
	PerTokenLen float64 `json:"bytes_per_token_len"`
}

// usable reports whether f could have come from fitMemory: finite, not
// negative, growing with the batch.
func (f cpuFit) usable() bool {
	return usableTerms(f.Base, f.PerToken, f.PerTokenLen) && (f.PerToken > 0 || f.PerTokenLen > 0)
}

// cpuCalibrationMethod names how the CPU calibration measures and fits
// memory. It leads every CPU cache key, so a fit made another way is never
// taken for one made this way. Name it anew (and say why here) with any
// change to what a reading is or how the fit is made from readings:
// measureCPU (the warm-up, the shapes, the repeats and which reading is
// kept), fitMemory, procSelf's resident and peak readings, and what the
// C heap does under ORT's runs, which the readings include: the malloc
// settings package model/ortenv makes, and when (configureMalloc and the C
// constructor beside it, which since 2784c71 makes them before any thread
// starts, so one arena serves every thread). Settings made from the
// environment are in the key already (mallocEnv).
//
// Before it there was a version number, 1, which did not change when
// InitRuntime fixed glibc's mmap threshold at 128 KiB (6d0f153): fits of
// the moving threshold, which could lose their quadratic term, were taken
// by the release that fixed it.
const cpuCalibrationMethod = "rss-peak-max3/glibc-1-arena-mmap-128k-from-start"

// cpuFitCache returns where the CPU engine's calibration is kept. The key
// is everything the fit depends on: how it was measured
// (cpuCalibrationMethod), the engine's own MemoryKey (the model's version,
// ONNX Runtime's release, the session's options: model.Session), the
// calibration's shapes and reference length, the C heap's settings from
// the environment, and the machine (OS, architecture, the CPU's model and
// features, the kernel's transparent huge pages mode, which changes how
// resident memory is counted).
func (p *Pool) cpuFitCache(eng Engine, shapes []Shape, adaptive bool, refLen int) *fitCache {
	dir := p.cfg.cpuMem.CacheDir
	memKey := memoryKey(eng)
	if dir == "" || memKey == "" {
		return nil
	}
	var b strings.Builder
	fmt.Fprintf(&b, "method=%s %s", cpuCalibrationMethod, memKey)
	fmt.Fprintf(&b, " shapes=%v adaptive=%t ref_len=%d token_id=%d", shapes, adaptive, refLen, p.cfg.calibration.TokenID)
	fmt.Fprintf(&b, " malloc=%q", mallocEnv())
	fmt.Fprintf(&b, " os=%s/%s cpu=%q thp=%q", runtime.GOOS, runtime.GOARCH, cpuIdentity(), firstLine("/sys/kernel/mm/transparent_hugepage/enabled"))
	return newFitCache(dir, "cpu", b.String())
}

// mallocEnv is the environment that changes how the C heap behaves under
// ORT's runs, and so what calibration reads: glibc's malloc tunables
// (which InitRuntime's own settings may override, not the others) and a
// preloaded allocator (jemalloc, tcmalloc), as "NAME=value" pairs in a fixed
// order; "" where none is set.
func mallocEnv() string {
	var set []string
	for _, name := range []string{"GLIBC_TUNABLES", "LD_PRELOAD", "MALLOC_ARENA_MAX", "MALLOC_ARENA_TEST",
		"MALLOC_MMAP_MAX_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_TRIM_THRESHOLD_"} {
		if v, ok := os.LookupEnv(name); ok {
			set = append(set, name+"="+v)
		}
	}
	return strings.Join(set, " ")
}

// cpuIdentity is the CPU's model name and a hash of its feature flags
// (ortenv.CPUIdentity): ONNX Runtime picks its kernels, and their scratch
// memory, by what the CPU supports.
func cpuIdentity() string { return ortenv.CPUIdentity() }

// firstLine is a file's first line, or "" where it cannot be read.
func firstLine(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	line, _, _ := strings.Cut(string(b), "\n")
	return strings.TrimSpace(line)
}
