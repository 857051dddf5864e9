package gpupool

import (
	"errors"
)

// deviceMemory is what admission holds on a GPU, guarded by Pool.mu.
type deviceMemory struct {
	reserved float64 // memory estimates of admitted batches running now
	// arenaPeak is the most memory our runs have needed at once on this
	// device: what ORT's arena may hold and reuse.
	arenaPeak float64
}

// admission is one admission decision.
type admission struct {
	ok        bool
	reason    string
	est       float64 // bytes reserved for the batch while it runs
	neverFits bool    // even an otherwise idle device could not run it
	gpuLost   bool
}

func (a admission) decision() string {
	if a.ok {
		return "admit"
	}
	return "refuse"
}

// admit decides whether d may run a batch of tokens padded tokens now. The
// batch needs its estimate, less what d's arena already holds and no running
// batch uses (ORT keeps freed memory for reuse, so it shows as "used" yet is
// available to us). A batch our arena covers entirely is admitted at once:
// running it allocates nothing, and used memory may well sit above
// MemFraction for good, because it counts our CUDA context and cuBLAS
// workspace beside an arena that never shrinks. Otherwise it is admitted when
// free memory covers the need plus Headroom and used memory (our arena
// included, once) plus the need stays under MemFraction of total. Probe
// errors other than a lost GPU admit: the run itself is the better judge,
// and an OOM there splits the batch anyway.
func (p *Pool) admit(d *device, rows, length int) admission {
	est := d.est.Bytes(rows, length)
	if p.probe == nil {
		return p.reserve(d, admission{ok: true, reason: "no_probe", est: est})
	}
	free, used, total, err := p.probe.MemoryInfo(d.dev.Index)
	p.updateHeat(d)
	if err != nil {
		if errors.Is(err, ErrGPULost) {
			return admission{reason: "gpu_lost", gpuLost: true}
		}
		return p.reserve(d, admission{ok: true, reason: "no_memory_info", est: est})
	}
	label := d.dev.Label()
	p.m.gpuMemFree.WithLabelValues(label).Set(float64(free))
	p.m.gpuMemUsed.WithLabelValues(label).Set(float64(used))
	limit := p.cfg.memFraction * float64(total)
	head := d.est.HeadroomBytes
	p.mu.Lock()
	defer p.mu.Unlock()
	budget := d.est.BudgetBytes
	// Other tenants come and go, so only our own weights and CUDA's
	// memory beside the arena count against what the device could ever
	// give a batch.
	if float64(d.est.WeightBytes)+d.est.BesideArenaBytes+est+head > min(limit, budget) {
		return admission{reason: "too_large", est: est, neverFits: true}
	}
	// What our arena holds: growth since the engine opened, but never more
	// than the largest footprint we caused, since other tenants grow too.
	held := min(max(0, float64(used)-float64(d.est.usedBase)), d.arenaPeak)
	// need is what the batch adds to used memory: the arena's idle part
	// (held less what running batches reserve) is credited here, so the
	// checks below count those bytes once, inside used.
	need := max(0, est-max(0, held-d.reserved))
	// Our own footprint after admitting: weights, CUDA's own memory
	// beside the arena (context, each worker's workspace) and an arena at
	// least as large as every batch running at once. It must stay in our
	// budget whatever the device has free, so a neighbour keeps its share.
	own := float64(d.est.WeightBytes) + d.est.BesideArenaBytes + max(d.arenaPeak, d.reserved+est)
	switch {
	case need == 0:
		d.reserved += est
		return admission{ok: true, reason: "arena", est: est}
	case own > budget:
		return admission{reason: "mem_limit", est: est}
	case float64(free) < need+head:
		return admission{reason: "free_memory", est: est}
	case float64(used)+need > limit:
		return admission{reason: "mem_fraction", est: est}
	}
	d.reserved += est
	d.arenaPeak = max(d.arenaPeak, d.reserved)
	return admission{ok: true, reason: "fits", est: est}
}

// gpuBudget is this process's memory budget on dev: GPU_MEM_LIMIT, or
// MemFraction of the device when no limit is set, and never above
// MemFraction.
func (p *Pool) gpuBudget(dev Device) float64 {
	limit := p.cfg.memFraction * float64(dev.TotalMemory)
	if b := p.cfg.memLimit.Of(dev.TotalMemory); b > 0 {
		return min(float64(b), limit)
	}
	return limit
}

func (p *Pool) reserve(d *device, a admission) admission {
	p.mu.Lock()
	d.reserved += a.est
	d.arenaPeak = max(d.arenaPeak, d.reserved)
	p.mu.Unlock()
	return a
}

// rowCapFunc returns the most rows of a given length one batch may have so
// that the roomiest device's memory model admits it: on a calibrated GPU,
// an otherwise idle device's room; on a CPU with CPUMemory, one worker's
// share of the budget. The planner cuts long pairs into fewer rows than the
// token budget allows, because attention memory grows with len². It
// snapshots the estimates once per plan. With no such device it is nil (no
// cap beyond rows and tokens).
func (p *Pool) rowCapFunc() func(length int) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	type dev struct {
		est  MemoryModel
		room float64
	}
	var devs []dev
	for _, d := range p.devices {
		switch {
		case d.degraded:
		case d.dev.Kind == CUDA && d.est.Calibrated:
			devs = append(devs, dev{d.est, d.est.Room(d.est.BudgetBytes)})
		case d.dev.Kind == CPU && d.cpu != nil:
			devs = append(devs, dev{d.est, d.est.Room(d.est.BudgetBytes)})
		}
	}
	if len(devs) == 0 {
		return nil
	}
	return func(length int) int {
		best := 1
		for _, d := range devs {
			best = max(best, d.est.MaxRows(length, d.room))
		}
		return best
	}
}
