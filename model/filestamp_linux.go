//go:build linux

package model

import (
	"os"
	"syscall"
)

// ctimeOf is the file's status-change time, ns since the epoch.
func ctimeOf(st os.FileInfo) int64 {
	if s, ok := st.Sys().(*syscall.Stat_t); ok {
		return s.Ctim.Nano()
	}
	return 0
}
