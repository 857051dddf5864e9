package onnxgraph_test

import (
	"fmt"
	"os"
	"testing"

	"github.com/scorer/scorer/internal/testenv"
	"github.com/scorer/scorer/model/ortenv"
)

// TestMain creates the one ORT environment for the tests that run a
// rewritten piece of graph (window_test.go), as model's TestMain does;
// the rest are pure graph and need none, but the environment is
// process-wide and so is made here once.
func TestMain(m *testing.M) {
	lib := os.Getenv("ORT_LIB")
	if lib == "" {
		lib = testenv.DefaultORTLib()
	}
	shutdown, err := ortenv.InitRuntime(lib)
	if err != nil {
		fmt.Fprintf(os.Stderr, "onnxgraph tests need the ONNX Runtime library (run `make ort` or set ORT_LIB): %v\n", err)
		os.Exit(1)
	}
	code := m.Run()
	if err := shutdown(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		code = 1
	}
	os.Exit(code)
}
