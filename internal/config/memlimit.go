package config

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/scorer/scorer/gpupool"
)

// MemoryLimit is the memory this process may use and where that number
// came from: "cgroup v2 memory.max", "cgroup v1 memory.limit_in_bytes" or
// "physical memory" (/proc/meminfo MemTotal). Bytes is 0 when nothing could
// be read.
type MemoryLimit struct {
	Bytes  uint64
	Source string
}

// DetectMemoryLimit reads the container's memory limit from the cgroup
// filesystem under root ("/" in production; tests pass a fake tree): the
// smallest memory.max on the process's cgroup v2 path and its ancestors, or
// cgroup v1's memory.limit_in_bytes; without a limit, physical memory.
// "max", and v1's "unlimited" (a huge round number), count as no limit.
func DetectMemoryLimit(root string) MemoryLimit {
	phys := physicalMemory(filepath.Join(root, "proc/meminfo"))
	cg, _ := os.ReadFile(filepath.Join(root, "proc/self/cgroup"))
	var best uint64
	var src string
	take := func(n uint64, from string) {
		if n > 0 && (phys == 0 || n < phys) && (best == 0 || n < best) {
			best, src = n, from
		}
	}
	sc := bufio.NewScanner(bytes.NewReader(cg))
	for sc.Scan() {
		// hierarchy-ID:controller-list:cgroup-path
		parts := strings.SplitN(sc.Text(), ":", 3)
		if len(parts) != 3 {
			continue
		}
		switch {
		case parts[0] == "0" && parts[1] == "":
			// v2: walk from the process's cgroup to the root; a parent's
			// limit binds its children. Inside a cgroup namespace the path
			// is "/" and the container's limit is at the mount's root.
			for dir := filepath.Clean("/" + parts[2]); ; dir = filepath.Dir(dir) {
				if n, ok := readLimit(filepath.Join(root, "sys/fs/cgroup", dir, "memory.max")); ok {
					take(n, "cgroup v2 memory.max")
				}
				if dir == "/" {
					break
				}
			}
		case slices.Contains(strings.Split(parts[1], ","), "memory"):
			for _, dir := range []string{filepath.Clean("/" + parts[2]), "/"} {
				if n, ok := readLimit(filepath.Join(root, "sys/fs/cgroup/memory", dir, "memory.limit_in_bytes")); ok {
					take(n, "cgroup v1 memory.limit_in_bytes")
				}
			}
		}
	}
	if best > 0 {
		return MemoryLimit{Bytes: best, Source: src}
	}
	if phys > 0 {
		return MemoryLimit{Bytes: phys, Source: "physical memory"}
	}
	return MemoryLimit{}
}

// readLimit reads a cgroup limit file: a byte count, or "max" (none).
func readLimit(path string) (uint64, bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, false
	}
	n, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	if err != nil || n >= 1<<62 { // "max", or v1's unlimited (PAGE_COUNTER_MAX pages)
		return 0, false
	}
	return n, true
}

func physicalMemory(meminfo string) uint64 {
	b, err := os.ReadFile(meminfo)
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "MemTotal:"); ok {
			f := strings.Fields(rest)
			if len(f) >= 1 {
				kib, err := strconv.ParseUint(f[0], 10, 64)
				if err == nil {
					return kib << 10
				}
			}
		}
	}
	return 0
}

// cpuBatchRefLen is the reference pair length behind CPU_MAX_BATCH_BYTES=auto.
const cpuBatchRefLen = 128

// CPUMemory is the CPU memory budget the pool plans batches against
// (gpupool.CPUMemoryConfig), from CPU_MEM_LIMIT and CPU_MAX_BATCH_BYTES
// over h's memory; nil when CPU_MAX_BATCH_BYTES=off. The MemoryLimit says
// where the limit came from.
//
// The budget: CPU_MEM_LIMIT (auto: the container's cgroup limit, else
// physical memory) less a reserve for what the process holds besides the
// model and its batches (the score cache's SCORE_CACHE_BYTES, twice
// MAX_INFLIGHT_BATCHES × BATCH_MAX_BYTES of input, and a tenth of the limit
// for the Go heap, fetch buffers and fragmentation), less the resident
// memory the pool measures once its CPU engine is open, split between the
// CPU workers; and no batch above CPU_MAX_BATCH_BYTES (auto: what
// CPU_MAX_BATCH_ROWS pairs of 128 tokens need on this model). The measured
// cost is kept in CPU_CALIBRATION_CACHE (gpupool.CPUMemoryConfig.CacheDir).
func (c *Config) CPUMemory(h Host) (*gpupool.CPUMemoryConfig, MemoryLimit, error) {
	batch := strings.TrimSpace(strings.ToLower(c.CPUMaxBatchBytes))
	if batch == "off" {
		return nil, MemoryLimit{}, nil
	}
	m := &gpupool.CPUMemoryConfig{RefLen: cpuBatchRefLen}
	if batch != "auto" && batch != "" {
		b, err := gpupool.ParseMemLimit(batch)
		if err != nil || b.Fraction > 0 || b.Bytes == 0 {
			return nil, MemoryLimit{}, fmt.Errorf("CPU_MAX_BATCH_BYTES %q: want auto, off or bytes (512MiB)", c.CPUMaxBatchBytes)
		}
		m.BatchBytes = b.Bytes
	}
	lim := MemoryLimit{}
	switch s := strings.TrimSpace(strings.ToLower(c.CPUMemLimit)); s {
	case "auto", "":
		lim = h.Memory
	case "0":
	default:
		l, err := gpupool.ParseMemLimit(s)
		if err != nil {
			return nil, MemoryLimit{}, fmt.Errorf("CPU_MEM_LIMIT %q: want auto, 0, bytes (6GiB) or a fraction of auto (0.8)", c.CPUMemLimit)
		}
		if l.Bytes > 0 {
			lim = MemoryLimit{Bytes: l.Bytes, Source: "CPU_MEM_LIMIT"}
		} else {
			auto := h.Memory
			lim = MemoryLimit{Bytes: l.Of(auto.Bytes), Source: fmt.Sprintf("CPU_MEM_LIMIT %s of %s", s, auto.Source)}
		}
	}
	m.CacheDir = calibrationCache(c.CPUCalibrationCache, "cpu-calibration")
	m.Limit = lim.Bytes
	if m.Limit > 0 {
		m.Reserve = uint64(max(c.ScoreCacheBytes, 0)) + 2*uint64(max(c.MaxInflightBatches, 0)*max(c.BatchMaxBytes, 0)) + m.Limit/10
		if m.Reserve >= m.Limit {
			return nil, lim, fmt.Errorf("CPU_MEM_LIMIT %d bytes (%s) is below what the process sets aside besides the model (%d: SCORE_CACHE_BYTES, in-flight input, a tenth for the heap)", m.Limit, lim.Source, m.Reserve)
		}
	}
	return m, lim, nil
}

// calibrationCache is the directory a CPU_CALIBRATION_CACHE or
// GPU_CALIBRATION_CACHE setting names: auto = scorer/sub in the user's
// cache directory, off = none (measure at every start).
func calibrationCache(setting, sub string) string {
	switch d := strings.TrimSpace(setting); strings.ToLower(d) {
	case "off":
		return ""
	case "auto", "":
		// No cache directory (no HOME): measure at every start.
		if base, err := os.UserCacheDir(); err == nil {
			return filepath.Join(base, "scorer", sub)
		}
		return ""
	default:
		return d
	}
}
