//go:build !linux

package model

import "os"

// lowerPriority does nothing where a thread's priority is not its own.
func lowerPriority() {}

// lockDir cannot lock here: a temporary folder is then removed by age
// alone (sweepGraphTemp).
func lockDir(string) (*os.File, bool) { return nil, false }
