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
