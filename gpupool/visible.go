package gpupool

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/scorer/scorer/model/ortenv"
)

// ErrMIGNeedsUUID means a MIG instance would be used without its MIG-…
// UUID being named, in CUDA_VISIBLE_DEVICES or as the one MIG instance of
// NVIDIA_VISIBLE_DEVICES. CUDA then picks an instance by its own rules, and
// which one NVML's readings (admission's memory) belong to would be a
// guess; with the UUID both sides agree. It is ortenv's sentinel, which
// DiagnoseCUDA reads.
var ErrMIGNeedsUUID = ortenv.ErrMIGNeedsUUID

// ErrMIGNoPermission means a GPU is in MIG mode and NVML refuses this
// process the parent GPU's readings (ortenv's sentinel).
var ErrMIGNoPermission = ortenv.ErrMIGNoPermission

// migByUUID requires that every MIG instance in visible was selected by
// its UUID (a unique prefix is enough): a MIG-… entry of
// CUDA_VISIBLE_DEVICES, or the only MIG-… entry of NVIDIA_VISIBLE_DEVICES.
// The second is how the NVIDIA device plugin hands a pod its MIG slice (it
// sets no CUDA_VISIBLE_DEVICES): the container runtime exposes the listed
// instance alone, so CUDA can open no other. With several MIG entries there
// CUDA still chooses among them, so they do not count.
func migByUUID(visible []nvmlGPU, lookupEnv func(string) (string, bool)) error {
	raw, _ := lookupEnv("CUDA_VISIBLE_DEVICES")
	names := migEntries(raw)
	runtime, _ := lookupEnv("NVIDIA_VISIBLE_DEVICES")
	if rt := migEntries(runtime); len(rt) == 1 {
		names = append(names, rt[0])
	}
	var missing []string
	for _, g := range visible {
		if !g.mig || g.uuid == "" || g.err != nil {
			continue
		}
		if !slices.ContainsFunc(names, func(e string) bool { return len(e) <= len(g.uuid) && strings.EqualFold(g.uuid[:len(e)], e) }) {
			missing = append(missing, g.uuid)
		}
	}
	if len(missing) == 0 {
		return nil
	}
	return fmt.Errorf("%w: CUDA_VISIBLE_DEVICES=%q, NVIDIA_VISIBLE_DEVICES=%q, MIG instance(s) readable here: %s: %w",
		ErrMIGNeedsUUID, raw, runtime, strings.Join(missing, ", "), ErrNoGPU)
}

// migEntries returns the MIG-… entries of a comma-separated device list.
func migEntries(list string) []string {
	var out []string
	for _, e := range strings.Split(list, ",") {
		e = strings.TrimSpace(e)
		if len(e) > len("MIG-") && strings.HasPrefix(strings.ToUpper(e), "MIG-") {
			out = append(out, e)
		}
	}
	return out
}

// pciOrder sorts GPUs by PCI bus id, CUDA's order under
// CUDA_DEVICE_ORDER=PCI_BUS_ID (which the service sets when unset): NVML's
// own index order is usually the same but not promised. Without every bus
// id known, NVML order stands. MIG instances of one GPU keep their order.
func pciOrder(gs []nvmlGPU) []nvmlGPU {
	for _, g := range gs {
		if g.pciBusID == "" {
			return gs
		}
	}
	out := slices.Clone(gs)
	slices.SortStableFunc(out, func(a, b nvmlGPU) int {
		return strings.Compare(strings.ToLower(a.pciBusID), strings.ToLower(b.pciBusID))
	})
	return out
}

// busID reads NVML's NUL-terminated PCI bus id.
func busID(raw []int8) string {
	b := make([]byte, 0, len(raw))
	for _, c := range raw {
		if c == 0 {
			break
		}
		b = append(b, byte(c))
	}
	return string(b)
}

// visibleGPUs applies CUDA_VISIBLE_DEVICES to NVML's GPUs. NVML ignores the
// variable while CUDA numbers only the GPUs it lists, in its order, so a
// GPU's CUDA device_id is its position in the result. Unset, every GPU is
// visible in NVML order. Entries are CUDA's: indexes, GPU UUIDs or unique
// UUID prefixes ("GPU-8932f937"). Like CUDA, the list ends at the first entry
// that names no GPU ("-1", an index past the last GPU, a repeat), and the
// rest is ignored with a warning. A "MIG-…" entry naming no MIG instance
// NVML can read is an error, as is a list that leaves no GPU visible; both
// wrap ErrNoGPU. Integer indexes follow
// CUDA_DEVICE_ORDER while NVML enumerates by PCI bus ID, so GPUs of
// different models without CUDA_DEVICE_ORDER=PCI_BUS_ID get a warning.
func visibleGPUs(all []nvmlGPU, lookupEnv func(string) (string, bool)) ([]nvmlGPU, []error, error) {
	raw, set := lookupEnv("CUDA_VISIBLE_DEVICES")
	if !set {
		out, warnings := oneMIG(all, orderWarning(all, lookupEnv))
		return out, warnings, nil
	}
	var (
		out      []nvmlGPU
		warnings []error
		byIndex  bool
	)
	entries := strings.Split(raw, ",")
	for k, e := range entries {
		e = strings.TrimSpace(e)
		i, err := matchVisible(all, e)
		if err != nil {
			return nil, nil, fmt.Errorf("gpupool: CUDA_VISIBLE_DEVICES=%q: %w", raw, err)
		}
		if i < 0 || slices.ContainsFunc(out, func(g nvmlGPU) bool { return g.index == all[i].index && g.uuid == all[i].uuid }) {
			if e != "" || k < len(entries)-1 {
				warnings = append(warnings, fmt.Errorf("gpupool: CUDA_VISIBLE_DEVICES=%q: CUDA stops at entry %q and ignores it and the rest", raw, e))
			}
			break
		}
		if _, err := strconv.Atoi(e); err == nil {
			byIndex = true
		}
		out = append(out, all[i])
	}
	if len(out) == 0 {
		return nil, nil, fmt.Errorf("gpupool: CUDA_VISIBLE_DEVICES=%q makes no GPU visible to CUDA: %w", raw, ErrNoGPU)
	}
	out, warnings = oneMIG(out, warnings)
	if byIndex {
		warnings = append(warnings, orderWarning(out, lookupEnv)...)
	}
	return out, warnings, nil
}

// matchVisible finds the position in all of the device one
// CUDA_VISIBLE_DEVICES entry names, or -1 for an entry that names no device
// (where CUDA stops). Integers are positions (CUDA's own numbering of the
// listed devices); "GPU-…" and "MIG-…" are UUIDs or unique prefixes of one.
func matchVisible(all []nvmlGPU, e string) (int, error) {
	if n, err := strconv.Atoi(e); err == nil {
		if n < 0 || n >= len(all) {
			return -1, nil
		}
		return n, nil
	}
	upper := strings.ToUpper(e)
	prefix := ""
	for _, p := range []string{"GPU-", "MIG-"} {
		if strings.HasPrefix(upper, p) && len(e) > len(p) {
			prefix = p
		}
	}
	if prefix == "" {
		return -1, nil
	}
	match, unread := -1, false
	for k, g := range all {
		if g.uuid == "" {
			unread = true
			continue
		}
		if len(e) <= len(g.uuid) && strings.EqualFold(g.uuid[:len(e)], e) {
			if match >= 0 {
				return -1, fmt.Errorf("entry %q matches more than one GPU: %w", e, ErrNoGPU)
			}
			match = k
		}
	}
	if match < 0 && prefix == "MIG-" {
		return -1, fmt.Errorf("entry %q names a MIG instance this process cannot read (NVML lists none with that UUID): %w: %w", e, ErrMIGNoPermission, ErrNoGPU)
	}
	if match < 0 && unread {
		// It may name the GPU whose UUID NVML cannot read; then neither it
		// nor any later entry has a known CUDA number.
		return -1, fmt.Errorf("entry %q matches no GPU whose UUID NVML can read: %w", e, ErrNoGPU)
	}
	return match, nil
}

// oneMIG keeps at most one MIG instance: CUDA uses a single MIG compute
// instance per process and ignores the others, so listing more would open
// sessions on CUDA ordinals that do not exist.
func oneMIG(gs []nvmlGPU, warnings []error) ([]nvmlGPU, []error) {
	seen := false
	var out []nvmlGPU
	for _, g := range gs {
		if g.mig {
			if seen {
				warnings = append(warnings, fmt.Errorf("gpupool: MIG instance %s left out: CUDA uses one MIG instance per process", g.uuid))
				continue
			}
			seen = true
		}
		out = append(out, g)
	}
	return out, warnings
}

// orderWarning warns when CUDA's numbering may not be NVML's: GPUs of
// different models under CUDA's default FASTEST_FIRST order.
func orderWarning(gs []nvmlGPU, lookupEnv func(string) (string, bool)) []error {
	if order, _ := lookupEnv("CUDA_DEVICE_ORDER"); order == "PCI_BUS_ID" {
		return nil
	}
	for _, g := range gs {
		if g.name != "" && gs[0].name != "" && g.name != gs[0].name {
			return []error{errors.New("gpupool: GPUs of different models without CUDA_DEVICE_ORDER=PCI_BUS_ID: " +
				"CUDA may number them differently from NVML; set CUDA_DEVICE_ORDER=PCI_BUS_ID")}
		}
	}
	return nil
}
