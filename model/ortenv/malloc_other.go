//go:build !linux || !cgo

package ortenv

func configureMalloc() bool { return false }

// TrimMalloc does nothing where malloc is not glibc's.
func TrimMalloc() {}

// MallocArenas cannot tell where malloc is not glibc's.
func MallocArenas() (int, bool) { return 0, false }

func setSessionHeap(bool) {}

func mallocMaps(int) (bool, int, bool) { return false, 0, false }
