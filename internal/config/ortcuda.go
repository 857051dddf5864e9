package config

import (
	"os"
	"path/filepath"

	"github.com/scorer/scorer/model/ortenv"
)

// cudaORTDir is where `make cuda-ort` puts the CUDA set: the core and the
// CUDA provider libraries of one release (deploy/ort/pins.txt).
const cudaORTDir = ".deps/ort-cuda"

// preferCUDASet returns the ORT_LIB to load. ONNX Runtime loads the CUDA
// provider from the core's own folder, and the default ORT_LIB (`make
// ort`'s core alone) has none there, so a GPU asked for with the default
// library would fail with missing_provider_files although `make cuda-ort`
// put the whole set beside it. When a GPU is asked for (DEVICE=cuda, or
// auto on a host with an NVIDIA driver) and ORT_LIB is the default, the CUDA
// set under root (the checkout the executable was built in, as for the
// default itself: never the working directory) is used if it is there; an
// explicit ORT_LIB is never changed.
func preferCUDASet(ortLib, device string, gpuHost bool, root string) string {
	if !(device == "cuda" || (device == "auto" || device == "") && gpuHost) || root == "" || !sameFile(ortLib, filepath.Join(root, defaultORTLib)) {
		return ortLib
	}
	if ortenv.HasCUDAProvider(ortLib) {
		return ortLib // the default folder has the providers itself
	}
	if set := filepath.Join(root, cudaORTDir, "libonnxruntime.so.1"); ortenv.HasCUDAProvider(set) {
		return set
	}
	return ortLib
}

// sameFile reports whether a and b name one existing file.
func sameFile(a, b string) bool {
	sa, errA := os.Stat(a)
	sb, errB := os.Stat(b)
	return errA == nil && errB == nil && os.SameFile(sa, sb)
}
