package gpupool

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"runtime"
	"strings"
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

// cpuFitCacheVersion changes whenever measureCPU or fitMemory measure or
// fit differently, so no fit of an earlier method is reused.
const cpuFitCacheVersion = 1

// cpuFitCache returns where the CPU engine's calibration is kept. The key
// is everything the fit depends on: the engine's own MemoryKey (the model's
// version, ONNX Runtime's release, the session's options: model.Session),
// the calibration's shapes and reference length, and the machine (OS,
// architecture, the CPU's model and features, the kernel's transparent huge
// pages mode, which changes how resident memory is counted).
func (p *Pool) cpuFitCache(eng Engine, shapes []Shape, adaptive bool, refLen int) *fitCache {
	dir := p.cfg.cpuMem.CacheDir
	memKey := memoryKey(eng)
	if dir == "" || memKey == "" {
		return nil
	}
	var b strings.Builder
	fmt.Fprintf(&b, "v=%d %s", cpuFitCacheVersion, memKey)
	fmt.Fprintf(&b, " shapes=%v adaptive=%t ref_len=%d token_id=%d", shapes, adaptive, refLen, p.cfg.calibration.TokenID)
	fmt.Fprintf(&b, " os=%s/%s cpu=%q thp=%q", runtime.GOOS, runtime.GOARCH, cpuIdentity(), firstLine("/sys/kernel/mm/transparent_hugepage/enabled"))
	return newFitCache(dir, "cpu", b.String())
}

// cpuIdentity is the CPU's model name and a hash of its feature flags
// (Linux's /proc/cpuinfo): ONNX Runtime picks its kernels, and their
// scratch memory, by what the CPU supports. Empty where it cannot be read.
func cpuIdentity() string {
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return ""
	}
	defer f.Close()
	var name, flags string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() && (name == "" || flags == "") {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		switch strings.TrimSpace(k) {
		case "model name":
			name = strings.TrimSpace(v)
		case "flags", "Features": // x86, arm64
			sum := sha256.Sum256([]byte(strings.TrimSpace(v)))
			flags = hex.EncodeToString(sum[:8])
		}
	}
	return name + " flags " + flags
}

// firstLine is a file's first line, or "" where it cannot be read.
func firstLine(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	line, _, _ := strings.Cut(string(b), "\n")
	return strings.TrimSpace(line)
}
