package ortenv

import (
	"os"
	"path/filepath"
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
