package main

import (
	"context"
	"errors"
)

// runBench is `scorer bench`. The benchmark suite (issue: pipeline vs raw ORT,
// padding, latency, memory) is not written yet; this says so plainly rather
// than printing numbers that mean nothing.
func runBench(_ context.Context, _ procEnv, _ []string) error {
	return errors.New("bench: not implemented yet; see docs/benchmarks.md")
}
