package testenv

import (
	"fmt"
	"os"
	"testing"
)

// MainWithORT is the TestMain of a package whose tests run ONNX Runtime: it
// starts the process's one environment with start (ortenv.InitRuntime; a
// parameter because ortenv's own tests use this too) from ORT_LIB or the
// default library, runs the tests, and shuts the environment down, checking
// that a second shutdown is a no-op. The environment is process-wide, so
// per-test setup would fight over it. It returns the code for os.Exit.
func MainWithORT(m *testing.M, pkg string, start func(lib string) (shutdown func() error, err error)) int {
	lib := os.Getenv("ORT_LIB")
	if lib == "" {
		lib = DefaultORTLib()
	}
	shutdown, err := start(lib)
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s tests need the ONNX Runtime library (run `make ort` or set ORT_LIB): %v\n", pkg, err)
		return 1
	}
	code := m.Run()
	if err := shutdown(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		code = 1
	}
	if err := shutdown(); err != nil {
		fmt.Fprintln(os.Stderr, "second shutdown should be a no-op:", err)
		code = 1
	}
	return code
}
