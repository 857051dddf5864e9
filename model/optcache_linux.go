//go:build linux

package model

import "syscall"

// lowerPriority gives the calling thread (locked to its goroutine) the
// lowest CPU priority, nice 19: on Linux a thread's nice value is its own
// (setpriority with a thread id), and threads it starts inherit it.
func lowerPriority() { _ = syscall.Setpriority(syscall.PRIO_PROCESS, syscall.Gettid(), 19) }
