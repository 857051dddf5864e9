package gpupool

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"
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
	for _, v := range []float64{f.Base, f.PerToken, f.PerTokenLen} {
		if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
			return false
		}
	}
	return f.PerToken > 0 || f.PerTokenLen > 0
}

// cpuFitFile is a kept calibration: the fit, the key it was measured under
// (in full, so a file is trusted only for exactly that key) and, for a
// person reading it, the readings and when.
type cpuFitFile struct {
	Key        string     `json:"key"`
	Fit        cpuFit     `json:"fit"`
	Points     []fitPoint `json:"points"`
	Calibrated time.Time  `json:"calibrated"`
}

type fitPoint struct {
	Rows  int     `json:"rows"`
	Len   int     `json:"len"`
	Bytes float64 `json:"bytes"`
}

// cpuFitCacheVersion changes whenever measureCPU or fitMemory measure or
// fit differently, so no fit of an earlier method is reused.
const cpuFitCacheVersion = 1

// fitCache is one calibration's place in CPUMemoryConfig.CacheDir; nil
// when nothing is kept (no CacheDir, or an engine that cannot name what
// its memory depends on). Its methods are safe on nil.
type fitCache struct {
	key, path string
}

// cpuFitCache returns where the CPU engine's calibration is kept. The key
// is everything the fit depends on: the engine's own MemoryKey (the model's
// version, ONNX Runtime's release, the session's options: model.Session),
// the calibration's shapes and reference length, and the machine (OS,
// architecture, the CPU's model and features, the kernel's transparent huge
// pages mode, which changes how resident memory is counted). The file is
// named by the key's hash.
func (p *Pool) cpuFitCache(eng Engine, shapes []Shape, adaptive bool, refLen int) *fitCache {
	dir := p.cfg.cpuMem.CacheDir
	if dir == "" {
		return nil
	}
	k, ok := eng.(interface{ MemoryKey() string })
	if !ok {
		return nil
	}
	memKey := k.MemoryKey()
	if memKey == "" {
		return nil
	}
	var b strings.Builder
	fmt.Fprintf(&b, "v=%d %s", cpuFitCacheVersion, memKey)
	fmt.Fprintf(&b, " shapes=%v adaptive=%t ref_len=%d token_id=%d", shapes, adaptive, refLen, p.cfg.calibration.TokenID)
	fmt.Fprintf(&b, " os=%s/%s cpu=%q thp=%q", runtime.GOOS, runtime.GOARCH, cpuIdentity(), firstLine("/sys/kernel/mm/transparent_hugepage/enabled"))
	key := b.String()
	sum := sha256.Sum256([]byte(key))
	return &fitCache{key: key, path: filepath.Join(dir, "cpu-"+hex.EncodeToString(sum[:12])+".json")}
}

// load returns the kept fit for c's key; false when there is none, or the
// file is unreadable, for another key or holds no usable fit (it is then
// measured again and overwritten).
func (c *fitCache) load() (cpuFit, bool) {
	if c == nil {
		return cpuFit{}, false
	}
	f, err := os.Open(c.path)
	if err != nil {
		return cpuFit{}, false
	}
	defer f.Close()
	var file cpuFitFile
	if err := json.NewDecoder(io.LimitReader(f, 1<<20)).Decode(&file); err != nil || file.Key != c.key || !file.Fit.usable() {
		return cpuFit{}, false
	}
	return file.Fit, true
}

// store keeps fit and its readings under c's key, replacing the file whole
// (written beside it, then renamed) so a reader never sees half of it.
func (c *fitCache) store(fit cpuFit, pts []memPoint) error {
	if c == nil {
		return nil
	}
	file := cpuFitFile{Key: c.key, Fit: fit, Calibrated: time.Now().UTC()}
	for _, pt := range pts {
		file.Points = append(file.Points, fitPoint{Rows: pt.rows, Len: pt.length, Bytes: pt.bytes})
	}
	data, err := json.MarshalIndent(file, "", "  ")
	if err != nil {
		return err
	}
	dir := filepath.Dir(c.path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("gpupool: cpu: calibration cache: %w", err)
	}
	tmp, err := os.CreateTemp(dir, ".cpu-*.tmp")
	if err != nil {
		return fmt.Errorf("gpupool: cpu: calibration cache: %w", err)
	}
	_, werr := tmp.Write(append(data, '\n'))
	if err := errors.Join(werr, tmp.Close()); err != nil {
		_ = os.Remove(tmp.Name())
		return fmt.Errorf("gpupool: cpu: calibration cache: %w", err)
	}
	if err := os.Rename(tmp.Name(), c.path); err != nil {
		_ = os.Remove(tmp.Name())
		return fmt.Errorf("gpupool: cpu: calibration cache: %w", err)
	}
	return nil
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
