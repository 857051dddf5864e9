//go:build linux

package gpupool

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
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

// mappedUnread sums, over this process's mappings of data files, the
// bytes not resident yet (Size less Rss in /proc/self/smaps): what reading
// them will add to the resident size, and to the container's memory.
// ONNX Runtime maps a model's large initializers (the embedding table most
// of all) and, for a session from GRAPH_CACHE, every prepacked weight,
// which no run has read at start. A data file is a regular one mapped
// readable and never executable: the binary's and the shared libraries'
// unread pages are code that may never run, not weights, and device files
// (/dev: GPU apertures, shared memory) are not the page cache's.
func (procSelf) mappedUnread() (uint64, error) {
	b, err := os.ReadFile("/proc/self/smaps")
	if err != nil {
		return 0, err
	}
	type mapping struct {
		path      string
		size, rss uint64
	}
	var maps []mapping
	code := map[string]bool{}
	var cur *mapping
	for _, line := range bytes.Split(b, []byte("\n")) {
		f := bytes.Fields(line)
		if len(f) >= 5 && bytes.IndexByte(f[0], '-') > 0 && !bytes.HasSuffix(f[0], []byte(":")) {
			// A mapping's header: range, perms, offset, dev, inode, path.
			cur = nil
			perms := string(f[1])
			if len(f) < 6 || f[5][0] != '/' || bytes.HasPrefix(f[5], []byte("/dev/")) || string(f[4]) == "0" {
				continue
			}
			path := string(bytes.Join(f[5:], []byte(" ")))
			if strings.Contains(perms, "x") {
				code[path] = true
				continue
			}
			if !strings.HasPrefix(perms, "r") {
				continue
			}
			maps = append(maps, mapping{path: path})
			cur = &maps[len(maps)-1]
			continue
		}
		if cur == nil || len(f) < 2 {
			continue
		}
		var dst *uint64
		switch string(f[0]) {
		case "Size:":
			dst = &cur.size
		case "Rss:":
			dst = &cur.rss
		default:
			continue
		}
		kib, err := strconv.ParseUint(string(f[1]), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc/self/smaps %s: %w", f[0], err)
		}
		*dst = kib << 10
	}
	var unread uint64
	for _, m := range maps {
		if !code[m.path] && m.size > m.rss {
			unread += m.size - m.rss
		}
	}
	return unread, nil
}
