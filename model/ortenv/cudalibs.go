package ortenv

import (
	"strings"
)

// CUDALibraries are the libraries the CUDA path needs beyond ONNX Runtime's
// own files, by soname: the CUDA provider's NEEDED entries (the CUDA 13
// runtime, cuBLAS, cuBLASLt, cuRAND and the driver's libcuda) and cuDNN 9,
// which the provider opens only at the first run of a cuDNN-backed kernel,
// so a session that opens does not prove it is there. libcudnn.so.9 loads
// its engines (libcudnn_graph.so.9 first) lazily too, so that is checked as
// well.
var CUDALibraries = []string{
	"libcuda.so.1", "libcudart.so.13", "libcublas.so.13", "libcublasLt.so.13", "libcurand.so.10",
	"libcudnn.so.9", "libcudnn_graph.so.9",
}

// LibraryLocation is where the dynamic loader finds one library.
type LibraryLocation struct {
	Name string `json:"name"`
	// Path is the file the loader opened; empty when it found none.
	Path string `json:"path,omitempty"`
	// From says where that is: "python wheel" for NVIDIA's pip wheels
	// (site-packages/nvidia/*/lib, what ONNX Runtime's Python package
	// preloads from), "driver" for libcuda, "system" otherwise.
	From string `json:"from,omitempty"`
	// Error is the loader's message when it found none or could not load it.
	Error string `json:"error,omitempty"`
}

// FindLibrary loads name as the CUDA provider would (by soname, through
// LD_LIBRARY_PATH and the ld.so cache) and says where it was found. It
// loads the library into this process for the lookup; call it before CUDA
// starts or where loading it is harmless.
func FindLibrary(name string) LibraryLocation {
	path, msg := findLibrary(name)
	loc := LibraryLocation{Name: name, Path: path, Error: msg}
	switch {
	case path == "":
	case strings.Contains(path, "/site-packages/nvidia/"):
		loc.From = "python wheel"
	case strings.HasPrefix(name, "libcuda.so"):
		loc.From = "driver"
	default:
		loc.From = "system"
	}
	return loc
}

// FindCUDALibraries is FindLibrary for each of CUDALibraries.
func FindCUDALibraries() []LibraryLocation {
	out := make([]LibraryLocation, len(CUDALibraries))
	for i, n := range CUDALibraries {
		out[i] = FindLibrary(n)
	}
	return out
}
