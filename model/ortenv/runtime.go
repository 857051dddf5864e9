package ortenv

import (
	"errors"
	"fmt"
	"os"
	"sync"

	ort "github.com/yalue/onnxruntime_go"
)

// InitRuntime loads the ONNX Runtime shared library at libPath and creates
// the process's one ORT environment. onnxruntime_go keeps that environment in
// a package global, so it must be created exactly once, before any Load or
// NewSession, and destroyed only after every session is closed: call it from
// main (or a TestMain) and defer the returned shutdown. A second call while
// the environment exists is an error rather than a silent no-op, because two
// owners would each believe they may destroy it.
//
// On glibc, malloc has been capped at one arena for the whole process and
// its mmap threshold fixed since before main (a C constructor; see
// configureMalloc, which InitRuntime calls to check and repeat it): ONNX
// Runtime's memory then no longer depends on which OS thread a cgo call ran
// on, nor on what earlier runs left in the heap.
//
// shutdown destroys the environment and unloads the library; calling it again
// is a no-op.
func InitRuntime(libPath string) (shutdown func() error, err error) {
	if libPath == "" {
		return nil, errors.New("ortenv: ONNX Runtime library path is empty")
	}
	// dlopen's message for a missing file is terse and names no remedy; a
	// stat first lets the error say what is wrong in our words.
	st, err := os.Stat(libPath)
	if err != nil {
		return nil, fmt.Errorf("ortenv: ONNX Runtime library %s: %w", libPath, err)
	}
	if st.IsDir() {
		return nil, fmt.Errorf("ortenv: ONNX Runtime library %s is a directory, want the shared library file", libPath)
	}
	if ort.IsInitialized() {
		return nil, errors.New("ortenv: ONNX Runtime environment is already initialized in this process")
	}
	// The constructor made these settings before any thread; this checks
	// and repeats them before ORT starts its own (see configureMalloc).
	configureMalloc()
	ort.SetSharedLibraryPath(libPath)
	if err := ort.InitializeEnvironment(); err != nil {
		return nil, fmt.Errorf("ortenv: initializing ONNX Runtime from %s: %w", libPath, err)
	}
	var once sync.Once
	var shutdownErr error
	return func() error {
		once.Do(func() {
			if err := ort.DestroyEnvironment(); err != nil {
				shutdownErr = fmt.Errorf("ortenv: destroying ONNX Runtime environment: %w", err)
			}
		})
		return shutdownErr
	}, nil
}

// Version is the loaded library's version string ("1.30.0"), for reports.
// The library must be loaded (InitRuntime).
func Version() string { return ort.GetVersion() }

// Float16 is the element type of fp16 tensors, as model.Model.OutputType
// names a graph's logits: commands that report on a model's precision
// compare against it without importing ONNX Runtime.
const Float16 = ort.TensorElementDataTypeFloat16
