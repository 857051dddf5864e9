package model

import (
	"errors"
	"strings"
	"testing"
)

func TestClassifyRunError(t *testing.T) {
	tests := []struct {
		msg string
		oom bool
	}{
		{"[ONNXRuntimeError] : 6 : RUNTIME_EXCEPTION : CUDA failure 2: out of memory ; GPU=0", true},
		{"CUDA error cudaErrorMemoryAllocation:out of memory", true},
		{"BFCArena::AllocateRawInternal Failed to allocate memory for requested buffer of size 1073741824", true},
		{"std::bad_alloc", true},
		{"CUDNN_STATUS_ALLOC_FAILED: CUDA_ERROR_OUT_OF_MEMORY", true},
		{"CUBLAS failure 3: CUBLAS_STATUS_ALLOC_FAILED ; GPU=0 ; hostname=h ; expr=cublasCreate(&cublas_handle_);", true},
		{"CUDNN failure 2: CUDNN_STATUS_ALLOC_FAILED ; GPU=0 ; hostname=h ; expr=cudnnCreate(&cudnn_handle_);", true},
		{"cudnn_status_alloc_failed", true},
		{"CUFFT failure 2: CUFFT_ALLOC_FAILED", true},
		{"CURAND failure 102: CURAND_STATUS_ALLOCATION_FAILED", true},
		{"[ONNXRuntimeError] : 1 : FAIL : Non-zero status code returned while running MatMul node. Name:'/MatMul' Status Message: " +
			"BFCArena::AllocateRawInternal Available memory of 0 is smaller than requested bytes of 4194304", true},
		{"CUDA failure 2: Out Of Memory ; GPU=0", true},
		{"Status Message: bad allocation", true},
		{"CUBLAS failure 13: CUBLAS_STATUS_EXECUTION_FAILED", false},
		{"CUDNN failure 3: CUDNN_STATUS_BAD_PARAM", false},
		{"CUDA failure 700: an illegal memory access was encountered", false},
		{"model: pair 0 has 600 tokens, max length is 512", false},
		{"Exiting due to terminate flag being set to true.", false},
		{"Invalid rank for input: input_ids Got: 1 Expected: 2", false},
	}
	for _, tc := range tests {
		err := classifyRunError(errors.New(tc.msg), 4, 16)
		if got := errors.Is(err, ErrOutOfMemory); got != tc.oom {
			t.Errorf("errors.Is(classify(%q), ErrOutOfMemory) = %v, want %v", tc.msg, got, tc.oom)
		}
		if !strings.HasPrefix(err.Error(), "model: ") || !strings.Contains(err.Error(), tc.msg) || !strings.Contains(err.Error(), "4×16") {
			t.Errorf("classify(%q) = %q, want model: prefix, batch shape and the ORT message", tc.msg, err)
		}
	}
}
