//go:build !linux

package model

// lowerPriority does nothing where a thread's priority is not its own.
func lowerPriority() {}
