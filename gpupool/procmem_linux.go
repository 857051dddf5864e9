//go:build linux

package gpupool

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
)

// procSelf reads this process's memory from /proc/self.
type procSelf struct{}

// resetPeak writes 5 to clear_refs, which sets VmHWM to the current
// resident size (Linux 4.0+). The reset is process-wide: afterwards VmHWM,
// and the ru_maxrss that wait4 and /usr/bin/time report, no longer show the
// session's load transient, the process's real peak on a large model. So
// measure a scorer's peak by polling VmRSS or VmHWM while it runs, as the
// bench does.
func (procSelf) resetPeak() error {
	if err := os.WriteFile("/proc/self/clear_refs", []byte("5"), 0); err != nil {
		return fmt.Errorf("resetting the peak resident size: %w", err)
	}
	return nil
}

// usage reads VmRSS and VmHWM from /proc/self/status.
func (procSelf) usage() (rss, peak uint64, err error) {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0, 0, err
	}
	var found int
	for _, line := range bytes.Split(b, []byte("\n")) {
		k, v, ok := bytes.Cut(line, []byte(":"))
		if !ok || (string(k) != "VmRSS" && string(k) != "VmHWM") {
			continue
		}
		f := bytes.Fields(v)
		if len(f) < 1 {
			continue
		}
		kib, err := strconv.ParseUint(string(f[0]), 10, 64)
		if err != nil {
			return 0, 0, fmt.Errorf("/proc/self/status %s: %w", k, err)
		}
		if string(k) == "VmRSS" {
			rss = kib << 10
		} else {
			peak = kib << 10
		}
		found++
	}
	if found != 2 {
		return 0, 0, errNoProcMemory
	}
	return rss, peak, nil
}

func defaultProcessMemory() processMemory { return procSelf{} }
