//go:build !linux || !cgo

package model

func configureMalloc() bool { return false }

func trimMalloc() {}
