//go:build !linux

package model

import "os"

// ctimeOf is 0 where the status-change time is not read: a stamp is then
// the size and modification time alone, and a write that keeps both goes
// unseen until the process restarts (Linux is where the scorer runs).
func ctimeOf(os.FileInfo) int64 { return 0 }
