package gpupool

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/scorer/scorer/internal/testenv"
	"github.com/scorer/scorer/model/ortenv"
)

// TestNVMLErrorDiagnosed: the probe's NVML errors carry what
// ortenv.DiagnoseCUDA reads, so a host without the NVML library is told
// it has no driver, not merely no GPU.
func TestNVMLErrorDiagnosed(t *testing.T) {
	err := fmt.Errorf("gpupool: opening cuda session: %w", nvmlError("init", nvml.ERROR_LIBRARY_NOT_FOUND))
	p, ok := ortenv.DiagnoseCUDA(err)
	if !ok || p.Kind != ortenv.ProblemNoDriver || !strings.Contains(p.Cause, "NVML") || !errors.Is(err, ErrNoGPU) {
		t.Fatalf("DiagnoseCUDA(%v) = %+v, %v; want %s naming NVML", err, p, ok, ortenv.ProblemNoDriver)
	}
}

// TestCheckCUDAWithoutProviderFiles appends the CUDA provider with the real
// core that `make ort` installs alone: ORT looks for its provider libraries
// beside it, and the diagnosis names the missing file.
func TestCheckCUDAWithoutProviderFiles(t *testing.T) {
	shutdown, err := ortenv.InitRuntime(testenv.ORTLib(t))
	if err != nil {
		t.Fatal(err)
	}
	defer shutdown()
	err = CheckCUDA(Device{Kind: CUDA, Index: 0}, SessionConfig{})
	var p *ortenv.CUDAProblem
	if !errors.As(err, &p) || p.Kind != ortenv.ProblemProviderFiles || !strings.Contains(p.Cause, "libonnxruntime_providers_shared.so") {
		t.Fatalf("CheckCUDA with the core alone = %v, want %s naming libonnxruntime_providers_shared.so", err, ortenv.ProblemProviderFiles)
	}
}
