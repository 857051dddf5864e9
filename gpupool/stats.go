package gpupool

import (
	"slices"
	"time"
)

// Stats is a snapshot of the pool's counters, kept so a benchmark can read
// batching and padding efficiency without scraping Prometheus.
type Stats struct {
	// Batches and Pairs count completed inference batches and their pairs.
	Batches, Pairs uint64
	// RealTokens and PaddedTokens sum the pairs' lengths and rows × longest
	// length over completed batches; their ratio is padding efficiency.
	RealTokens, PaddedTokens uint64
	// Splits counts batches split in two (after OOM, errors or refusals).
	Splits uint64
	// OOMRetries counts runs that failed for lack of memory.
	OOMRetries uint64
	// RunErrors counts runs that failed for any other reason.
	RunErrors uint64
	// Refusals counts GPU admission refusals.
	Refusals uint64
	// Fallbacks counts lazily created CPU engines.
	Fallbacks uint64
	// Dropped counts queued batches discarded because their call had
	// already ended (cancelled or failed).
	Dropped uint64
	// QueuedPairs is the pairs waiting now; InFlightBatches the batches
	// running now.
	QueuedPairs, InFlightBatches int
	// OldestRun is how long the longest engine run going on now has taken
	// so far (0: none). Each run is one batch, bounded by the batch caps,
	// so a run far longer than a batch takes is hung (a driver call or a
	// run that ignores cancellation), while the other devices may go on.
	OldestRun time.Duration
	// Devices has one entry per device, fallback included.
	Devices []DeviceStats
	// GPUBusy has one entry per GPU the pool opened (none on the CPU):
	// how much of the pool's life each was busy.
	GPUBusy []GPUBusy
}

// DeviceStats is one device's share of the work and its health.
type DeviceStats struct {
	Device Device
	// Workers is how many workers pull batches for this device.
	Workers        int
	Batches, Pairs uint64
	Degraded, Hot  bool
	Fallback       bool
	// Memory is the device's memory model as the pool plans and admits
	// with it: the calibrated cost of a batch, what the pool counts beside
	// it, and the budget (zero on a CPU without CPUMemory and on the CPU
	// fallback).
	Memory MemoryModel
}

// PaddingEfficiency is RealTokens / PaddedTokens: 1 means no padding.
func (s Stats) PaddingEfficiency() float64 {
	if s.PaddedTokens == 0 {
		return 0
	}
	return float64(s.RealTokens) / float64(s.PaddedTokens)
}

// Stats returns a snapshot of the pool's counters.
func (p *Pool) Stats() Stats {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := p.stats
	s.QueuedPairs = p.queue.pairs
	s.InFlightBatches = p.inflight
	for _, at := range p.running {
		s.OldestRun = max(s.OldestRun, time.Since(at))
	}
	s.Devices = make([]DeviceStats, len(p.devices))
	for i, d := range p.devices {
		s.Devices[i] = DeviceStats{Device: d.dev, Workers: d.workers, Batches: d.batches, Pairs: d.pairs, Degraded: d.degraded,
			Hot: d.hot, Fallback: d.fallback, Memory: d.est}
	}
	s.GPUBusy = slices.Clone(p.busy)
	return s
}
