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

// ErrSessionClosed is returned by a Session used after Close, so a caller
// racing shutdown gets an error instead of a use-after-free in ORT.
var ErrSessionClosed = errors.New("model: session closed")

// oomMarkers are lower-cased fragments of the messages ORT and CUDA produce
// when an allocation fails. ORT reports them only as text, so matching text is
// the one way to tell "too big a batch" apart from other failures.
var oomMarkers = []string{
	"out of memory",
	"out_of_memory",
	"cudaerrormemoryallocation",
	"bad_alloc",
	"failed to allocate memory",
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
