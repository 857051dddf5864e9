//go:build unix

package model

import (
	"io/fs"
	"syscall"
)

// fileOwner is the uid that owns the file st describes.
func fileOwner(st fs.FileInfo) (uint32, bool) {
	s, ok := st.Sys().(*syscall.Stat_t)
	if !ok {
		return 0, false
	}
	return s.Uid, true
}
