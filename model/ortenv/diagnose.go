package ortenv

// The host checks: why this host cannot run the CUDA path. DiagnoseCUDA maps
// the errors ONNX Runtime, the dynamic loader and NVML give onto one cause
// and one remedy each, and FindCUDALibraries finds the CUDA libraries the
// provider loads. gpupool uses them at start, `scorer doctor` in its report,
// so both say the same thing in the same words. gpupool's NVML errors reach
// them as sentinels and the NVMLReturn method.

import (
	"errors"
	"fmt"
	"path"
	"regexp"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// Problem kinds: why the CUDA path cannot run here. Each has one cause and
// one remedy (CUDAProblem), so startup and `scorer doctor` say the same
// thing in the same words.
const (
	// ProblemNoCUDAProvider: the ONNX Runtime library is a CPU-only build.
	ProblemNoCUDAProvider = "no_cuda_provider"
	// ProblemProviderFiles: libonnxruntime_providers_shared.so or
	// libonnxruntime_providers_cuda.so is not beside the core library.
	ProblemProviderFiles = "missing_provider_files"
	// ProblemCUDARuntime: a CUDA runtime library the provider links
	// (libcudart, libcublas, libcublasLt, libcurand, cuDNN) is missing.
	ProblemCUDARuntime = "missing_cuda_runtime"
	// ProblemNoDriver: no NVIDIA driver (libcuda.so.1, NVML) or one too old
	// for the CUDA runtime.
	ProblemNoDriver = "no_driver"
	// ProblemNoDevice: a driver but no GPU visible to this process.
	ProblemNoDevice = "no_device"
	// ProblemMIGPermission: the GPU is in MIG mode and this process may not
	// read the parent GPU, and no MIG instance was given to it.
	ProblemMIGPermission = "mig_no_permission"
	// ProblemMIGNeedsUUID: a GPU is in MIG mode and neither
	// CUDA_VISIBLE_DEVICES nor NVIDIA_VISIBLE_DEVICES (the device plugin's
	// one MIG instance) names the instance by its MIG-… UUID.
	ProblemMIGNeedsUUID = "mig_needs_uuid"
)

// CUDAProblem is a diagnosed reason the CUDA path cannot run. It wraps the
// original error so errors.Is/As still see it.
type CUDAProblem struct {
	// Kind is one of the Problem* constants.
	Kind string
	// Cause is one line saying what is wrong, naming the missing file or
	// library where there is one.
	Cause string
	// Remedy is one line saying what to do about it.
	Remedy string
	// Err is the underlying error from ONNX Runtime or NVML.
	Err error
}

func (p *CUDAProblem) Error() string {
	return fmt.Sprintf("%s (remedy: %s): %v", p.Cause, p.Remedy, p.Err)
}

func (p *CUDAProblem) Unwrap() error { return p.Err }

// cannotOpenRe finds the library dlopen could not load in ORT's provider
// bridge message: "... with error: libcublasLt.so.13: cannot open shared
// object file".
var cannotOpenRe = regexp.MustCompile(`([^\s:]+\.so[.0-9]*): cannot open shared object file`)

// invalidDeviceRe reads the CUDA provider's answer to a device_id past the
// devices CUDA sees (cuda_execution_provider_info / cuda_provider_factory):
// "Invalid device ID: 3, must be between 0 (inclusive) and 1 (exclusive)."
var invalidDeviceRe = regexp.MustCompile(`Invalid device ID: (-?\d+), must be between 0 \(inclusive\) and (\d+) \(exclusive\)`)

// DiagnoseCUDA explains err, an error from creating or appending the CUDA
// execution provider or from NVML, as a CUDAProblem; ok is false when err is
// none of the known causes (it is then reported as is). The texts matched
// are ONNX Runtime's own (provider_bridge_ort.cc, the CUDA provider's
// factory, cudaGetErrorString) and dlopen's.
func DiagnoseCUDA(err error) (*CUDAProblem, bool) {
	if err == nil {
		return nil, false
	}
	var p *CUDAProblem
	if errors.As(err, &p) {
		return p, true
	}
	msg := err.Error()
	low := strings.ToLower(msg)
	mk := func(kind, cause, remedy string) (*CUDAProblem, bool) {
		return &CUDAProblem{Kind: kind, Cause: cause, Remedy: remedy, Err: err}, true
	}
	switch {
	case strings.Contains(low, "not enabled in this build") || strings.Contains(low, "cuda execution provider is not enabled"):
		return mk(ProblemNoCUDAProvider, "the ONNX Runtime library (ORT_LIB) is a CPU-only build without the CUDA execution provider",
			"use the core pinned in deploy/ort/pins.txt (`make cuda-ort`, or the CUDA image)")
	case errors.Is(err, ErrMIGNeedsUUID):
		return mk(ProblemMIGNeedsUUID, "the GPU is in MIG mode and neither CUDA_VISIBLE_DEVICES nor NVIDIA_VISIBLE_DEVICES (as one MIG instance) names the MIG instance, so which instance CUDA uses is not known",
			"request one MIG resource from the device plugin (it sets NVIDIA_VISIBLE_DEVICES=MIG-<uuid>), or set CUDA_VISIBLE_DEVICES=MIG-<uuid> to the instance's UUID (the error lists the readable ones; `nvidia-smi -L` too), or set DEVICE=cpu")
	case errors.Is(err, ErrMIGNoPermission):
		return mk(ProblemMIGPermission, "the GPU is in MIG mode and this process may not read it",
			"give the container a MIG instance (NVIDIA_VISIBLE_DEVICES=MIG-…, or a MIG resource from the device plugin), or set DEVICE=cpu")
	}
	if m := cannotOpenRe.FindStringSubmatch(msg); m != nil {
		lib := path.Base(m[1])
		switch {
		case strings.HasPrefix(lib, "libonnxruntime_providers_"):
			return mk(ProblemProviderFiles, fmt.Sprintf("%s is not beside the ONNX Runtime core library", lib),
				"install libonnxruntime_providers_shared.so and libonnxruntime_providers_cuda.so of the same release next to ORT_LIB (`make cuda-ort` puts the set in .deps/ort-cuda)")
		case strings.HasPrefix(lib, "libcuda.so") || strings.HasPrefix(lib, "libnvidia-ml.so"):
			return mk(ProblemNoDriver, fmt.Sprintf("no NVIDIA driver: %s cannot be loaded", lib),
				"install an NVIDIA driver >= 580 (CUDA 13) on the host and run with the NVIDIA container toolkit (--gpus / the device plugin), or set DEVICE=cpu")
		default:
			return mk(ProblemCUDARuntime, fmt.Sprintf("the CUDA runtime library %s is missing", lib),
				"run the CUDA image (its nvidia/cuda 13 base has it) or install CUDA 13 runtime libraries on LD_LIBRARY_PATH, or set DEVICE=cpu")
		}
	}
	if m := invalidDeviceRe.FindStringSubmatch(msg); m != nil {
		return mk(ProblemNoDevice, fmt.Sprintf("CUDA device %s does not exist here: CUDA sees %s device(s), numbered from 0 after CUDA_VISIBLE_DEVICES", m[1], m[2]),
			"use a CUDA index below "+m[2]+" or a GPU UUID in GPU_IDS, and check CUDA_VISIBLE_DEVICES against `scorer doctor`'s gpu lines")
	}
	switch {
	case strings.Contains(low, "insufficient") && strings.Contains(low, "driver"),
		strings.Contains(low, "cudaerrorinsufficientdriver"):
		return mk(ProblemNoDriver, "the NVIDIA driver is older than the CUDA 13 runtime the provider needs",
			"upgrade the host driver to >= 580, or set DEVICE=cpu")
	case strings.Contains(low, "no cuda-capable device"), strings.Contains(low, "cudaerrornodevice"),
		strings.Contains(low, "invalid device ordinal"):
		return mk(ProblemNoDevice, "the driver sees no GPU for this process",
			"check NVIDIA_VISIBLE_DEVICES/CUDA_VISIBLE_DEVICES and the container's GPU request, or set DEVICE=cpu")
	case errors.Is(err, ErrNoGPU):
		var st nvmlReturner
		if errors.As(err, &st) && (st.NVMLReturn() == nvml.ERROR_LIBRARY_NOT_FOUND || st.NVMLReturn() == nvml.ERROR_DRIVER_NOT_LOADED) {
			return mk(ProblemNoDriver, "no NVIDIA driver: NVML is not available",
				"install an NVIDIA driver >= 580 and run with the NVIDIA container toolkit, or set DEVICE=cpu")
		}
		return mk(ProblemNoDevice, "NVML lists no usable GPU for this process",
			"check NVIDIA_VISIBLE_DEVICES/CUDA_VISIBLE_DEVICES and the container's GPU request, or set DEVICE=cpu")
	}
	return nil, false
}

// The states DiagnoseCUDA reads from NVML. gpupool's probe wraps them
// (gpupool.ErrNoGPU, ErrMIGNeedsUUID and ErrMIGNoPermission are these
// values), so errors.Is sees them through either name.
var (
	// ErrNoGPU means no GPU can be used at all: the NVML library is missing,
	// the driver is not loaded, or NVML lists zero devices.
	ErrNoGPU = errors.New("gpupool: no GPU")
	// ErrMIGNeedsUUID means a MIG instance would be used without
	// CUDA_VISIBLE_DEVICES, or NVIDIA_VISIBLE_DEVICES as its one MIG
	// instance, naming it by its MIG-… UUID.
	ErrMIGNeedsUUID = errors.New("gpupool: GPU in MIG mode without CUDA_VISIBLE_DEVICES or NVIDIA_VISIBLE_DEVICES=MIG-<uuid>")
	// ErrMIGNoPermission means a GPU is in MIG mode and NVML refuses this
	// process the parent GPU's readings (NO_PERMISSION) while listing no MIG
	// instance it may use.
	ErrMIGNoPermission = errors.New("gpupool: GPU in MIG mode, no permission on the parent GPU")
)

// nvmlReturner is an error that carries NVML's return code (gpupool's NVML
// state errors do).
type nvmlReturner interface{ NVMLReturn() nvml.Return }
