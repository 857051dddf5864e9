package ortenv

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
)

// CUDAProviderLib is the CUDA execution provider's library, which ONNX
// Runtime loads from its core's own folder.
const CUDAProviderLib = "libonnxruntime_providers_cuda.so"

// HasCUDAProvider reports whether the ONNX Runtime core at core exists
// with the CUDA provider library beside it: where a GPU is wanted, a core
// without it fails with missing provider files at the first CUDA session.
func HasCUDAProvider(core string) bool {
	_, errCore := os.Stat(core)
	_, errProvider := os.Stat(filepath.Join(filepath.Dir(core), CUDAProviderLib))
	return errCore == nil && errProvider == nil
}

// NVIDIADriverLoaded reports whether this host has an NVIDIA driver, from
// its control device; no library is loaded to find out.
func NVIDIADriverLoaded() bool {
	_, err := os.Stat("/dev/nvidiactl")
	return err == nil
}

// CPUIdentity is the CPU's model name and a hash of its feature flags
// (Linux's /proc/cpuinfo): ONNX Runtime picks its kernels, their scratch
// memory and the layout of prepacked weights by what the CPU supports.
// Empty where it cannot be read.
func CPUIdentity() string {
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
