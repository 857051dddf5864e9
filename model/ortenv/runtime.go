package ortenv

import (
	"errors"
	"fmt"
	"os"
	"sync"

	ort "github.com/yalue/onnxruntime_go"
)

// env is who holds the process's one environment: the owner InitRuntime
// returned it to, until that owner's shutdown, and Pin's holders.
var env struct {
	sync.Mutex
	lib   string // the library it was created from; "" when there is none
	owned bool
	pins  int
}

// InitRuntime loads the ONNX Runtime shared library at libPath and creates
// the process's one ORT environment. onnxruntime_go keeps that environment in
// a package global, so it must be created exactly once, before any Load or
// NewSession, and destroyed only after every session is closed: call it from
// main (or a TestMain) and defer the returned shutdown. A second call while
// the environment has an owner is an error rather than a silent no-op,
// because two owners would each believe they may destroy it. An environment
// whose owner shut it down while Pin's work went on is taken over instead:
// the new owner gets it as it is, loaded from the same library.
//
// On glibc, malloc has been capped at one arena for the whole process and
// its mmap threshold fixed since before main (a C constructor; see
// configureMalloc, which InitRuntime calls to check and repeat it): ONNX
// Runtime's memory then no longer depends on which OS thread a cgo call ran
// on, nor on what earlier runs left in the heap.
//
// shutdown destroys the environment and unloads the library, or leaves
// that to the last unpin while work is pinned; calling it again is a no-op.
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
	env.Lock()
	defer env.Unlock()
	if ort.IsInitialized() {
		if env.owned || env.lib == "" {
			return nil, errors.New("ortenv: ONNX Runtime environment is already initialized in this process")
		}
		if loaded, err := os.Stat(env.lib); err != nil || !os.SameFile(loaded, st) {
			return nil, fmt.Errorf("ortenv: ONNX Runtime from %s is still loaded for work its last owner left running; cannot load %s in the same process", env.lib, libPath)
		}
		env.owned = true
		return ownerShutdown(), nil
	}
	// The constructor made these settings before any thread; this checks
	// and repeats them before ORT starts its own (see configureMalloc).
	configureMalloc()
	ort.SetSharedLibraryPath(libPath)
	if err := ort.InitializeEnvironment(); err != nil {
		return nil, fmt.Errorf("ortenv: initializing ONNX Runtime from %s: %w", libPath, err)
	}
	env.lib, env.owned = libPath, true
	return ownerShutdown(), nil
}

// ownerShutdown is an owner's shutdown (see InitRuntime).
func ownerShutdown() func() error {
	var once sync.Once
	var shutdownErr error
	return func() error {
		once.Do(func() {
			env.Lock()
			defer env.Unlock()
			env.owned = false
			if env.pins == 0 {
				shutdownErr = destroyLocked()
			}
		})
		return shutdownErr
	}
}

// destroyLocked destroys the environment; env is locked.
func destroyLocked() error {
	env.lib = ""
	if err := ort.DestroyEnvironment(); err != nil {
		return fmt.Errorf("ortenv: destroying ONNX Runtime environment: %w", err)
	}
	return nil
}

// Pin keeps the environment loaded for work that may outlive its owner
// (a session being created, which cannot be interrupted: the graph cache's
// write) until unpin is called. The owner's shutdown then leaves the
// environment to the last unpin, which destroys it unless a new owner has
// taken it over (InitRuntime): so a process that ends a scorer while such
// work runs can start another, and the work finishes on the environment it
// began on. ok is false when there is no environment to pin.
func Pin() (unpin func(), ok bool) {
	env.Lock()
	defer env.Unlock()
	if !env.owned || !ort.IsInitialized() {
		return nil, false
	}
	env.pins++
	var once sync.Once
	return func() {
		once.Do(func() {
			env.Lock()
			defer env.Unlock()
			if env.pins--; env.pins == 0 && !env.owned && env.lib != "" {
				// Nobody can report this error: the owner has gone.
				_ = destroyLocked()
			}
		})
	}, true
}

// Version is the loaded library's version string ("1.30.0"), for reports.
// The library must be loaded (InitRuntime).
func Version() string { return ort.GetVersion() }

// Float16 is the element type of fp16 tensors, as model.Model.OutputType
// names a graph's logits: commands that report on a model's precision
// compare against it without importing ONNX Runtime.
const Float16 = ort.TensorElementDataTypeFloat16
