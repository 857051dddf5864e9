package onnxgraph_test

import (
	"os"
	"testing"

	"github.com/scorer/scorer/internal/testenv"
	"github.com/scorer/scorer/model/ortenv"
)

// TestMain runs the package's tests in the process's one ONNX Runtime
// environment: the tests that run a rewritten piece of graph
// (window_test.go) need it, and it is process-wide.
func TestMain(m *testing.M) { os.Exit(testenv.MainWithORT(m, "onnxgraph", ortenv.InitRuntime)) }
