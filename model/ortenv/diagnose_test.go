package ortenv

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// nvmlErr is an NVML state error as gpupool's probe makes them: it carries
// the return code and wraps the state's sentinel.
type nvmlErr struct {
	ret   nvml.Return
	state error
}

func (e nvmlErr) Error() string           { return "gpupool: nvml init: " + e.state.Error() }
func (e nvmlErr) Unwrap() error           { return e.state }
func (e nvmlErr) NVMLReturn() nvml.Return { return e.ret }

// TestDiagnoseCUDA maps the messages ONNX Runtime, dlopen and NVML give for
// each way the CUDA path fails onto one cause and remedy each. The ORT texts
// are copied from ORT 1.29.0's real answers on this machine (see gpupool's
// TestCheckCUDAWithoutProviderFiles and deploy/ort's packaging test).
func TestDiagnoseCUDA(t *testing.T) {
	bridge := "/onnxruntime_src/onnxruntime/core/session/provider_bridge_ort.cc:1988 onnxruntime::Provider& onnxruntime::ProviderLibrary::Get() [ONNXRuntimeError] : 1 : FAIL : Failed to load library /opt/onnxruntime/lib/libonnxruntime_providers_cuda.so with error: "
	tests := []struct {
		name      string
		err       error
		kind      string
		causeName string // text the cause must contain
	}{
		{"CPU-only build", errors.New("CUDA execution provider is not enabled in this build."), ProblemNoCUDAProvider, "CPU-only"},
		{"no shared provider", errors.New("FAIL : Failed to load library /x/libonnxruntime_providers_shared.so with error: /x/libonnxruntime_providers_shared.so: cannot open shared object file: No such file or directory"),
			ProblemProviderFiles, "libonnxruntime_providers_shared.so"},
		{"no CUDA provider", errors.New("Failed to load library /x/libonnxruntime_providers_cuda.so with error: /x/libonnxruntime_providers_cuda.so: cannot open shared object file: No such file or directory"),
			ProblemProviderFiles, "libonnxruntime_providers_cuda.so"},
		{"no cuBLASLt", errors.New(bridge + "libcublasLt.so.13: cannot open shared object file: No such file or directory"), ProblemCUDARuntime, "libcublasLt.so.13"},
		{"no cudart", errors.New(bridge + "libcudart.so.13: cannot open shared object file: No such file or directory"), ProblemCUDARuntime, "libcudart.so.13"},
		{"no driver library", errors.New(bridge + "libcuda.so.1: cannot open shared object file: No such file or directory"), ProblemNoDriver, "libcuda.so.1"},
		{"old driver", errors.New("CUDA failure 35: CUDA driver version is insufficient for CUDA runtime version"), ProblemNoDriver, "older"},
		{"no device", errors.New("CUDA failure 100: no CUDA-capable device is detected"), ProblemNoDevice, "no GPU"},
		{"bad device id", errors.New("/onnxruntime_src/onnxruntime/core/providers/cuda/cuda_execution_provider_info.cc:145 [ONNXRuntimeError] : 1 : FAIL : Invalid device ID: 3, must be between 0 (inclusive) and 1 (exclusive)."),
			ProblemNoDevice, "CUDA device 3 does not exist here: CUDA sees 1 device"},
		{"NVML missing", nvmlErr{nvml.ERROR_LIBRARY_NOT_FOUND, ErrNoGPU}, ProblemNoDriver, "NVML"},
		{"NVML zero devices", fmt.Errorf("gpupool: nvml lists zero devices: %w", ErrNoGPU), ProblemNoDevice, "no usable GPU"},
		{"MIG", fmt.Errorf("gpupool: device 0: %w", ErrMIGNoPermission), ProblemMIGPermission, "MIG"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p, ok := DiagnoseCUDA(fmt.Errorf("gpupool: opening cuda session: %w", tc.err))
			if !ok {
				t.Fatalf("not diagnosed: %v", tc.err)
			}
			if p.Kind != tc.kind || !strings.Contains(p.Cause, tc.causeName) || p.Remedy == "" {
				t.Errorf("got %s %q (remedy %q), want %s naming %q", p.Kind, p.Cause, p.Remedy, tc.kind, tc.causeName)
			}
			if !errors.Is(p, tc.err) {
				t.Error("the diagnosis does not wrap the original error")
			}
			if strings.Contains(p.Cause, "\n") || strings.Contains(p.Remedy, "\n") {
				t.Error("cause or remedy is not one line")
			}
		})
	}
	if _, ok := DiagnoseCUDA(errors.New("model: running 4×32 batch: something else")); ok {
		t.Error("an unrelated error was diagnosed")
	}
}
