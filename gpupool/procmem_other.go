//go:build !linux

package gpupool

type noProcMemory struct{}

func (noProcMemory) resetPeak() error                     { return errNoProcMemory }
func (noProcMemory) usage() (rss, peak uint64, err error) { return 0, 0, errNoProcMemory }
func (noProcMemory) mappedUnread() (uint64, error)        { return 0, errNoProcMemory }

func defaultProcessMemory() processMemory { return noProcMemory{} }
