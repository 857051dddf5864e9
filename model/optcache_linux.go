//go:build linux

package model

import (
	"os"
	"syscall"
)

// lowerPriority gives the calling thread (locked to its goroutine) the
// lowest CPU priority, nice 19: on Linux a thread's nice value is its own
// (setpriority with a thread id), and threads it starts inherit it.
func lowerPriority() { _ = syscall.Setpriority(syscall.PRIO_PROCESS, syscall.Gettid(), 19) }

// lockDir takes an exclusive lock on the folder at path without waiting:
// the lock is held while the returned file is open, and released by the
// kernel when the process that holds it exits, however it exits. false
// when another process (or open file) holds it.
func lockDir(path string) (*os.File, bool) {
	f, err := os.Open(path)
	if err != nil {
		return nil, false
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		return nil, false
	}
	return f, true
}
