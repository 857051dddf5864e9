package model

import (
	"errors"
	"fmt"
	"strings"
)

// ErrOutOfMemory marks an inference that failed because the device (or host)
// ran out of memory. gpupool tests for it with errors.Is to split a batch and
// retry, instead of treating the device as broken.
var ErrOutOfMemory = errors.New("model: out of memory")

// ErrInvalidInput marks a batch that no device can run because a pair itself
// is malformed (empty, longer than the model's maximum, type ids that don't
// match). Callers test it with errors.Is so that such a failure is not blamed
// on the device or retried.
var ErrInvalidInput = errors.New("model: invalid input")

// ErrSessionClosed is returned by a Session used after Close, so a caller
// racing shutdown gets an error instead of a use-after-free in ORT.
var ErrSessionClosed = errors.New("model: session closed")

// oomMarkers are lower-cased fragments of the messages ORT and CUDA produce
// when an allocation fails. ORT reports them only as text, so matching text is
// the one way to tell "too big a batch" apart from other failures.
var oomMarkers = []string{
	"out of memory",             // cudaGetErrorString(cudaErrorMemoryAllocation), TensorRT
	"out_of_memory",             // CUDA_ERROR_OUT_OF_MEMORY
	"cudaerrormemoryallocation", // the runtime error's name
	"alloc_failed",              // CUBLAS_STATUS_ALLOC_FAILED, CUDNN_STATUS_ALLOC_FAILED, CUFFT_ALLOC_FAILED, CUSPARSE_STATUS_ALLOC_FAILED
	"allocation_failed",         // CURAND_STATUS_ALLOCATION_FAILED
	"bad_alloc",                 // std::bad_alloc
	"bad allocation",            // std::bad_alloc's what() on MSVC
	"failed to allocate memory", // BFCArena::AllocateRawInternal when cudaMalloc fails
	// BFCArena when gpu_mem_limit is reached: "Available memory of N is
	// smaller than requested bytes of M".
	"is smaller than requested bytes",
}

// isOutOfMemory reports whether an ORT error message describes a failed
// allocation.
func isOutOfMemory(err error) bool {
	if err == nil {
		return false
	}
	msg := strings.ToLower(err.Error())
	for _, m := range oomMarkers {
		if strings.Contains(msg, m) {
			return true
		}
	}
	return false
}

// classifyRunError wraps an error from ORT's Run with context and, when it is
// an allocation failure, with ErrOutOfMemory too, so both errors.Is checks and
// the original message survive.
func classifyRunError(err error, rows, length int) error {
	if isOutOfMemory(err) {
		return fmt.Errorf("model: running %d×%d batch: %w: %w", rows, length, ErrOutOfMemory, err)
	}
	return fmt.Errorf("model: running %d×%d batch: %w", rows, length, err)
}
