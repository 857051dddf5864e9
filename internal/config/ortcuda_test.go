package config

import (
	"os"
	"path/filepath"
	"testing"
)

// With the default ORT_LIB (the core alone), asking for a GPU loads the
// CUDA set that `make cuda-ort` put beside it, whose folder holds the
// provider libraries ONNX Runtime looks for; an explicit ORT_LIB, the CPU,
// or auto on a host without a driver keep the configured library.
func TestPreferCUDASet(t *testing.T) {
	root := t.TempDir()
	write := func(rel string) {
		p := filepath.Join(root, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(defaultORTLib)
	def := filepath.Join(root, defaultORTLib)
	cudaSet := filepath.Join(root, cudaORTDir, "libonnxruntime.so.1")
	// No CUDA set yet: nothing to switch to.
	if got := preferCUDASet(def, "cuda", false, root); got != def {
		t.Errorf("without the CUDA set: %s", got)
	}
	write(filepath.Join(cudaORTDir, "libonnxruntime.so.1"))
	write(filepath.Join(cudaORTDir, "libonnxruntime_providers_shared.so"))
	write(filepath.Join(cudaORTDir, "libonnxruntime_providers_cuda.so"))
	for _, tc := range []struct {
		lib, device string
		gpuHost     bool
		want        string
	}{
		{def, "cuda", false, cudaSet},
		{def, "auto", true, cudaSet},
		{def, "", true, cudaSet},
		{def, "auto", false, def},
		{def, "cpu", true, def},
		{"/opt/ort/libonnxruntime.so.1", "cuda", true, "/opt/ort/libonnxruntime.so.1"},
		// The default file named another way, as the Makefile may export it.
		{filepath.Join(root, "x", "..", defaultORTLib), "cuda", false, cudaSet},
		// The same relative path from the working directory is not the default.
		{defaultORTLib, "cuda", false, defaultORTLib},
	} {
		if got := preferCUDASet(tc.lib, tc.device, tc.gpuHost, root); got != tc.want {
			t.Errorf("ORT_LIB=%s DEVICE=%q gpu host %v: %s, want %s", tc.lib, tc.device, tc.gpuHost, got, tc.want)
		}
	}
	// A default folder that has the providers itself is left alone.
	write(filepath.Join(filepath.Dir(defaultORTLib), "libonnxruntime_providers_cuda.so"))
	if got := preferCUDASet(def, "cuda", true, root); got != def {
		t.Errorf("default folder with providers: %s", got)
	}
}
