//go:build !linux || !cgo

package model

func singleMallocArena() bool { return false }

func trimMalloc() {}
