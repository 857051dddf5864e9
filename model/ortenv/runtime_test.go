package ortenv

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/scorer/scorer/internal/testenv"
)

func TestInitRuntimeErrors(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "libonnxruntime.so.1")
	tests := []struct {
		name, lib, want string
	}{
		{"empty path", "", "path is empty"},
		{"missing library", missing, missing},
		{"directory", t.TempDir(), "is a directory"},
		// TestMain already initialised the environment with the real
		// library; a second owner must be refused.
		{"already initialized", testenv.ORTLib(t), "already initialized"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			shutdown, err := InitRuntime(tc.lib)
			if err == nil {
				shutdown()
				t.Fatalf("InitRuntime(%q) succeeded, want error", tc.lib)
			}
			if !strings.HasPrefix(err.Error(), "ortenv: ") || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("InitRuntime(%q) = %v, want an ortenv: error mentioning %q", tc.lib, err, tc.want)
			}
		})
	}
}

// TestProbeRuntime asks the real library for its providers through the C
// API: the core every build ships is CUDA-capable, and a file that is not
// ONNX Runtime is refused by name, not crashed on.
func TestProbeRuntime(t *testing.T) {
	info, err := ProbeRuntime(testenv.ORTLib(t))
	if err != nil {
		t.Fatal(err)
	}
	if !info.HasProvider("CUDAExecutionProvider") || !info.HasProvider("CPUExecutionProvider") {
		t.Errorf("providers %v, want CUDAExecutionProvider and CPUExecutionProvider", info.Providers)
	}
	if info.Version != Version() || Version() == "" {
		t.Errorf("probe says version %q, the loaded environment %q", info.Version, Version())
	}
	notORT := filepath.Join(t.TempDir(), "libnot.so")
	if err := os.WriteFile(notORT, []byte("not a library"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, lib := range []string{"", notORT, filepath.Join(t.TempDir(), "missing.so")} {
		if _, err := ProbeRuntime(lib); err == nil || !strings.HasPrefix(err.Error(), "ortenv: probing ONNX Runtime") {
			t.Errorf("ProbeRuntime(%q) = %v, want an ortenv: probing error", lib, err)
		}
	}
}
