package service

import (
	"os"
	"path/filepath"
	"reflect"
)

// cudaORTDir is where `make cuda-ort` puts the CUDA set: the core and the
// CUDA provider libraries of one release (deploy/ort/pins.txt).
const cudaORTDir = ".deps/ort-cuda"

// defaultORTLib is ORT_LIB's default, read from Config's tag so it follows
// whichever core the build pins.
var defaultORTLib = func() string {
	f, _ := reflect.TypeFor[Config]().FieldByName("ORTLib")
	return f.Tag.Get("envDefault")
}()

// preferCUDASet returns the ORT_LIB to load. ONNX Runtime loads the CUDA
// provider from the core's own folder, and the default ORT_LIB (`make
// ort`'s core alone) has none there, so a GPU asked for with the default
// library would fail with missing_provider_files although `make cuda-ort`
// put the whole set beside it. When a GPU is asked for (DEVICE=cuda, or
// auto on a host with an NVIDIA driver) and ORT_LIB is the default, the CUDA
// set is used if it is there; an explicit ORT_LIB is never changed.
func preferCUDASet(ortLib, device string, gpuHost bool, resolve func(string) (string, error)) string {
	if !(device == "cuda" || (device == "auto" || device == "") && gpuHost) || !isDefaultLib(ortLib, resolve) {
		return ortLib
	}
	if core, err := resolve(ortLib); err == nil {
		if _, err := os.Stat(filepath.Join(filepath.Dir(core), "libonnxruntime_providers_cuda.so")); err == nil {
			return ortLib // the default folder has the providers itself
		}
	}
	set := filepath.Join(cudaORTDir, "libonnxruntime.so.1")
	if p, err := resolve(set); err == nil {
		if _, err := os.Stat(filepath.Join(filepath.Dir(p), "libonnxruntime_providers_cuda.so")); err == nil {
			return p
		}
	}
	return ortLib
}

// isDefaultLib reports whether ortLib is the default library: its relative
// path, or that file named another way (the Makefile exports it absolute).
func isDefaultLib(ortLib string, resolve func(string) (string, error)) bool {
	if ortLib == defaultORTLib {
		return true
	}
	def, err := resolve(defaultORTLib)
	if err != nil {
		return false
	}
	a, errA := os.Stat(def)
	b, errB := os.Stat(ortLib)
	return errA == nil && errB == nil && os.SameFile(a, b)
}

// nvidiaDriverLoaded reports whether this host has an NVIDIA driver, from
// its control device; no library is loaded to find out.
func nvidiaDriverLoaded() bool {
	_, err := os.Stat("/dev/nvidiactl")
	return err == nil
}
