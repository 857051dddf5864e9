package ortenv

import (
	"fmt"
	"os"
	"testing"

	"github.com/scorer/scorer/internal/testenv"
)

// TestMain creates the one ORT environment, as the scorer does at start:
// TestInitRuntimeErrors checks that a second owner is refused and
// TestProbeRuntime that the probe agrees with the loaded library.
func TestMain(m *testing.M) {
	lib := os.Getenv("ORT_LIB")
	if lib == "" {
		lib = testenv.DefaultORTLib()
	}
	shutdown, err := InitRuntime(lib)
	if err != nil {
		fmt.Fprintf(os.Stderr, "ortenv tests need the ONNX Runtime library (run `make ort` or set ORT_LIB): %v\n", err)
		os.Exit(1)
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
	os.Exit(code)
}
