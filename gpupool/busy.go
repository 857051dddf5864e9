package gpupool

import (
	"errors"
	"time"
)

// defaultBusyInterval is how often the pool reads each GPU's utilization.
// NVML averages its reading over a window of 1/6 s to 1 s depending on the
// product, so reading more often than that only repeats a window, and
// reading much less often would miss the short idle gaps (tokenising,
// copies, waiting for a batch) the ratio exists to show.
const defaultBusyInterval = 250 * time.Millisecond

// GPUBusy is how busy one GPU was while the pool ran: the mean of NVML's
// utilization readings (the share of time one kernel or more was running),
// sampled every 250 ms from the end of New. It is a time share, not SM
// occupancy: a GPU running one small kernel at a time reads as busy.
type GPUBusy struct {
	Device Device
	// Samples is how many readings were taken; Percent is their sum.
	Samples, Percent uint64
	// Unsupported is set when NVML cannot read this GPU's utilization (a
	// MIG instance, for one): Samples then stays 0 and there is no ratio.
	Unsupported bool
}

// Ratio is the mean busy share in [0, 1]; ok is false without a reading,
// so a caller never prints 0 for "not measured".
func (b GPUBusy) Ratio() (ratio float64, ok bool) {
	if b.Samples == 0 {
		return 0, false
	}
	return float64(b.Percent) / float64(b.Samples) / 100, true
}

// Since is b over the time after before, an earlier snapshot of the same
// GPU: a benchmark takes one after its warm-up and reads the timed part.
func (b GPUBusy) Since(before GPUBusy) GPUBusy {
	if b.Device != before.Device || before.Samples > b.Samples {
		return b
	}
	b.Samples -= before.Samples
	b.Percent -= before.Percent
	return b
}

// BusySince is Since for each GPU of now, matched by device to before.
func BusySince(now, before []GPUBusy) []GPUBusy {
	out := make([]GPUBusy, len(now))
	for i, b := range now {
		out[i] = b
		for _, a := range before {
			if a.Device == b.Device {
				out[i] = b.Since(a)
			}
		}
	}
	return out
}

// busyState is the sampler's per-GPU tally, guarded by Pool.mu; nil
// when the pool has no GPU.
type busyState struct {
	busy []GPUBusy
}

// startBusySamplerLocked reads the utilization of every GPU the pool opened
// until Close begins. The CPU (and the CPU fallback) has no reading, so a
// CPU pool has no sampler, no series and no GPUBusy.
func (p *Pool) startBusySamplerLocked() {
	if p.probe == nil {
		return
	}
	var gpus []*device
	for _, d := range p.devices {
		if d.dev.Kind == CUDA {
			gpus = append(gpus, d)
			p.busy = append(p.busy, GPUBusy{Device: d.dev})
		}
	}
	if len(gpus) == 0 {
		return
	}
	p.wg.Add(1)
	go p.sampleBusy(gpus)
}

func (p *Pool) sampleBusy(gpus []*device) {
	defer p.wg.Done()
	t := time.NewTicker(p.cfg.busyInterval)
	defer t.Stop()
	for {
		select {
		case <-t.C:
		case <-p.closing:
			return
		case <-p.abortCtx.Done():
			return
		}
		for i, d := range gpus {
			p.mu.Lock()
			off := p.busy[i].Unsupported
			p.mu.Unlock()
			if off {
				continue
			}
			// A degraded GPU is still read: its idle time is part of
			// what the run lost.
			util, err := p.probe.Utilization(d.dev.Index)
			if errors.Is(err, ErrNotSupported) {
				p.log.Info().Err(err).Str("device", d.dev.Label()).Msg("gpupool: NVML cannot read this GPU's utilization; no busy ratio for it")
				p.mu.Lock()
				p.busy[i].Unsupported = true
				p.mu.Unlock()
				continue
			}
			if err != nil {
				// A lost reading (a lost GPU shows in its runs): the
				// mean is over the readings taken.
				continue
			}
			util = min(util, 100)
			p.m.gpuBusy.WithLabelValues(d.dev.Label()).Set(float64(util) / 100)
			p.mu.Lock()
			p.busy[i].Samples++
			p.busy[i].Percent += uint64(util)
			p.mu.Unlock()
		}
	}
}

// MeasureBusy reads the utilization of dev (a GPU of probe) every interval
// (0: every 250 ms) until the returned stop, which gives the readings: for
// timing work outside a pool, as gpu-proof bench times its shapes on a bare
// session. A reading NVML cannot take marks the result Unsupported.
func MeasureBusy(probe Probe, dev Device, interval time.Duration) (stop func() GPUBusy) {
	if interval <= 0 {
		interval = defaultBusyInterval
	}
	done := make(chan struct{})
	out := make(chan GPUBusy, 1)
	go func() {
		b := GPUBusy{Device: dev}
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-done:
				out <- b
				return
			case <-t.C:
			}
			if b.Unsupported {
				continue
			}
			util, err := probe.Utilization(dev.Index)
			switch {
			case errors.Is(err, ErrNotSupported):
				b.Unsupported = true
			case err == nil:
				b.Samples++
				b.Percent += uint64(min(util, 100))
			}
		}
	}()
	return func() GPUBusy {
		close(done)
		return <-out
	}
}

// MeanBusy is the busy ratio of several GPUs together (all readings
// pooled); ok is false when none has a reading.
func MeanBusy(busy []GPUBusy) (ratio float64, ok bool) {
	var all GPUBusy
	for _, b := range busy {
		all.Samples += b.Samples
		all.Percent += b.Percent
	}
	return all.Ratio()
}
