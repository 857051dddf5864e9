package service

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
	resolve := func(p string) (string, error) {
		abs := filepath.Join(root, p)
		_, err := os.Stat(abs)
		return abs, err
	}
	cudaSet := filepath.Join(root, cudaORTDir, "libonnxruntime.so.1")
	// No CUDA set yet: nothing to switch to.
	if got := preferCUDASet(defaultORTLib, "cuda", false, resolve); got != defaultORTLib {
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
		{defaultORTLib, "cuda", false, cudaSet},
		{defaultORTLib, "auto", true, cudaSet},
		{defaultORTLib, "", true, cudaSet},
		{defaultORTLib, "auto", false, defaultORTLib},
		{defaultORTLib, "cpu", true, defaultORTLib},
		{"/opt/ort/libonnxruntime.so.1", "cuda", true, "/opt/ort/libonnxruntime.so.1"},
		// The default file by its absolute path, as the Makefile exports it.
		{filepath.Join(root, defaultORTLib), "cuda", false, cudaSet},
	} {
		if got := preferCUDASet(tc.lib, tc.device, tc.gpuHost, resolve); got != tc.want {
			t.Errorf("ORT_LIB=%s DEVICE=%q gpu host %v: %s, want %s", tc.lib, tc.device, tc.gpuHost, got, tc.want)
		}
	}
	// A default folder that has the providers itself is left alone.
	write(filepath.Join(filepath.Dir(defaultORTLib), "libonnxruntime_providers_cuda.so"))
	if got := preferCUDASet(defaultORTLib, "cuda", true, resolve); got != defaultORTLib {
		t.Errorf("default folder with providers: %s", got)
	}
}
