package gpupool

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/scorer/scorer/model/ortenv"
)

// deviceSet is the pool's devices, guarded by Pool.mu: the GPUs New
// opened and the CPU (the pool's own, or the fallback a worker creates
// when no GPU can run a batch).
type deviceSet struct {
	devices     []*device
	creatingCPU bool // a worker is creating the fallback CPU engine
}

// device is one execution device with its engine and workers.
type device struct {
	slot     int
	dev      Device
	engine   Engine
	workers  int
	fallback bool // lazily created CPU engine
	est      MemoryModel
	// cpu is a CPU device's memory budget (CPUMemory); nil: none.
	cpu *cpuBudget

	// What each job keeps per device, all guarded by Pool.mu: health and
	// probation (health.go), admission's reservations (admission.go), and
	// the batches and pairs it completed (stats).
	deviceHealth
	deviceMemory
	batches uint64
	pairs   uint64
}

// engineMaxLength is the longest pair e accepts, in tokens, or 0 when e
// does not say (MaxLength() int, as model.Session says it).
func engineMaxLength(e Engine) int {
	if e, ok := e.(interface{ MaxLength() int }); ok {
		return e.MaxLength()
	}
	return 0
}

// openDevices fills p.devices according to the mode.
func (p *Pool) openDevices(ctx context.Context) error {
	if p.cfg.mode == ModeCPU {
		return p.openCPU(ctx, false)
	}
	reason := p.openGPUs(ctx)
	if len(p.devices) > 0 {
		return nil
	}
	if p.probeShutdown != nil {
		p.probeShutdown()
		p.probeShutdown = nil
	}
	if p.cfg.mode == ModeCUDA {
		if pr, ok := ortenv.DiagnoseCUDA(reason); ok {
			// The cause and its remedy lead, so the one line a failed start
			// leaves says what to do; the details follow.
			return fmt.Errorf("gpupool: mode cuda but no GPU works: %s; remedy: %s: %w", pr.Cause, pr.Remedy, reason)
		}
		return fmt.Errorf("gpupool: mode cuda but no GPU works: %w", reason)
	}
	ev := p.log.Warn().Err(reason)
	if pr, ok := ortenv.DiagnoseCUDA(reason); ok {
		ev = ev.Str("problem", pr.Kind).Str("cause", pr.Cause).Str("remedy", pr.Remedy)
	}
	ev.Msg("gpupool: no usable GPU, scoring on CPU")
	return p.openCPU(ctx, false)
}

// openCPU opens the CPU engine. The pool's own CPU device (not a lazily
// created fallback, which must start at once) takes CPUBatchShape and is
// calibrated when CPUMemory is set.
func (p *Pool) openCPU(ctx context.Context, fallback bool) error {
	if !fallback {
		// The pool runs on the CPU for good: its batches take the CPU shape
		// from here on, the memory calibration's reference batch included.
		if t := p.cfg.cpuBatchTokens; t > 0 {
			p.cfg.maxBatchTokens = min(p.cfg.maxBatchTokens, t)
		}
		if r := p.cfg.cpuBatchRows; r > 0 {
			p.cfg.maxBatchRows = min(p.cfg.maxBatchRows, r)
		}
	}
	dev := Device{Kind: CPU, Name: "cpu"}
	eng, err := p.factory(dev)
	if err != nil {
		return fmt.Errorf("gpupool: opening CPU engine: %w", err)
	}
	var est MemoryModel
	var bud *cpuBudget
	if p.cfg.cpuMem != nil && !fallback {
		mem := p.cfg.procMem
		if mem == nil {
			mem = defaultProcessMemory()
		}
		t0 := time.Now()
		if est, bud, err = p.calibrateCPU(ctx, eng, mem, p.workersFor(dev)); err != nil {
			_ = eng.Close()
			return err
		}
		if bud != nil {
			p.log.Info().Float64("estimate_base_bytes", est.Base).Float64("estimate_bytes_per_token", est.PerToken).
				Float64("estimate_bytes_per_token_len", est.PerTokenLen).Uint64("limit_bytes", p.cfg.cpuMem.Limit).
				Uint64("baseline_bytes", bud.baseline).Uint64("mapped_unread_bytes", bud.unread).Uint64("reserve_bytes", p.cfg.cpuMem.Reserve).
				Int("workers", p.workersFor(dev)).Float64("batch_bytes", bud.room).Dur("took", time.Since(t0)).
				Msg("gpupool: cpu: memory calibrated; batches are cut to batch_bytes each")
		}
	}
	d := p.addDeviceLocked(dev, eng, est, fallback)
	d.cpu = bud
	return nil
}

// workersFor is how many workers pull batches for dev.
func (p *Pool) workersFor(dev Device) int {
	w := p.cfg.workersPerDevice
	switch {
	case dev.Kind == CPU && p.cfg.cpuWorkers > 0:
		w = p.cfg.cpuWorkers
	case w == 0 && dev.Kind == CUDA:
		w = 2 // overlap one batch's host work with the other's kernels
	case w == 0:
		w = 1 // the CPU session already spreads one batch over every core
	}
	return w
}

func (p *Pool) addDeviceLocked(dev Device, eng Engine, est MemoryModel, fallback bool) *device {
	w := p.workersFor(dev)
	if dev.Kind == CUDA {
		// What admission and the planner count against, fixed for the
		// pool's life; the model carries it so its Room is theirs.
		est.BudgetBytes, est.HeadroomBytes = p.gpuBudget(dev), float64(p.cfg.headroom)
	}
	d := &device{slot: len(p.devices), dev: dev, engine: eng, workers: w, fallback: fallback, est: est, deviceMemory: deviceMemory{arenaPeak: est.arena}}
	if dev.Kind == CUDA {
		p.m.gpuDegraded.WithLabelValues(dev.Label()).Set(0) // the series exists before anything goes wrong
	}
	p.devices = append(p.devices, d)
	p.m.deviceAdded(dev.Kind)
	return d
}

// openGPUs opens every selected GPU whose engine opens and calibrates. It
// returns why no GPU (or some GPU) could not be used.
func (p *Pool) openGPUs(ctx context.Context) error {
	probe := p.cfg.probe
	if probe == nil {
		pr, shutdown, err := NewNVMLProbe(ctx)
		if err != nil {
			return err
		}
		probe, p.probeShutdown = pr, shutdown
	}
	p.probe = probe
	infos, err := probe.Devices()
	if err != nil {
		return err
	}
	infos, err = selectGPUs(infos, p.cfg.gpuIDs)
	if err != nil {
		return err
	}
	if len(infos) == 0 {
		return fmt.Errorf("gpupool: GPU_IDS %v selects no GPU: %w", p.cfg.gpuIDs, ErrNoGPU)
	}
	guard, gerr := ortenv.SaveSignals()
	if gerr != nil {
		p.log.Warn().Err(gerr).Msg("gpupool: cannot save signal handlers before CUDA init")
	}
	p.sigGuard = guard
	var reasons []error
	for _, info := range infos {
		dev := Device{Kind: CUDA, Index: info.Index, UUID: info.UUID, Name: info.Name, TotalMemory: info.TotalMemory}
		_, usedBefore, _, _ := probe.MemoryInfo(info.Index)
		eng, err := p.factory(dev)
		if err != nil {
			reasons = append(reasons, fmt.Errorf("gpupool: %s (%s): opening engine: %w", dev.Label(), dev.UUID, err))
			continue
		}
		est, err := p.calibrate(ctx, dev, eng, usedBefore, p.workersFor(dev))
		if err != nil {
			_ = eng.Close()
			reasons = append(reasons, err)
			continue
		}
		p.log.Info().Str("device", dev.Label()).Str("uuid", dev.UUID).Str("name", dev.Name).
			Uint64("total_bytes", dev.TotalMemory).Uint64("weights_bytes", est.WeightBytes).
			Float64("estimate_base_bytes", est.Base).Float64("estimate_bytes_per_token", est.PerToken).
			Float64("estimate_bytes_per_token_len", est.PerTokenLen).Float64("estimate_bytes_per_row", est.PerRow).
			Float64("estimate_held_out_error", est.HeldOut).Float64("arena_bytes", est.arena).
			Float64("beside_arena_bytes", est.BesideArenaBytes).Bool("beside_arena_measured", est.BesideArenaMeasured).
			Bool("calibrated", est.Calibrated).Msg("gpupool: GPU ready")
		p.addDeviceLocked(dev, eng, est, false)
	}
	// CUDA may have replaced SIGINT/SIGTERM handlers while initialising
	// (onnxruntime_go #140); put Go's back before anything else happens.
	if guard != nil {
		if err := guard.Restore(); err != nil {
			p.log.Warn().Err(err).Msg("gpupool: cannot restore signal handlers after CUDA init")
		}
	}
	if p.cfg.afterCUDAInit != nil {
		p.cfg.afterCUDAInit()
	}
	if len(reasons) > 0 && len(p.devices) > 0 {
		p.log.Warn().Err(errors.Join(reasons...)).Msg("gpupool: some GPUs are unusable")
	}
	return errors.Join(reasons...)
}

// selectGPUs keeps the GPUs named in ids (NVML index or UUID); no ids keeps
// all. A name that matches nothing is an error: a typo must not silently
// shrink the pool.
func selectGPUs(infos []DeviceInfo, ids []string) ([]DeviceInfo, error) {
	if len(ids) == 0 {
		return infos, nil
	}
	var out []DeviceInfo
	for _, id := range ids {
		id = strings.TrimSpace(id)
		found := false
		for _, in := range infos {
			if id == strconv.Itoa(in.Index) || strings.EqualFold(id, in.UUID) {
				if !slices.ContainsFunc(out, func(o DeviceInfo) bool { return o.Index == in.Index }) {
					out = append(out, in)
				}
				found = true
			}
		}
		if !found {
			return nil, fmt.Errorf("gpupool: GPU id %q matches no device NVML lists: %w", id, ErrNoGPU)
		}
	}
	return out, nil
}

func (p *Pool) startWorkersLocked(d *device) {
	for i := 0; i < d.workers; i++ {
		p.wg.Add(1)
		go p.worker(d)
	}
}

// closeEngines closes every engine and, if the pool opened NVML, shuts it
// down. It runs once, after every worker has exited.
func (p *Pool) closeEngines() error {
	p.mu.Lock()
	devs := slices.Clone(p.devices)
	p.mu.Unlock()
	var errs []error
	for _, d := range devs {
		if err := d.engine.Close(); err != nil {
			errs = append(errs, fmt.Errorf("gpupool: closing %s engine: %w", d.dev.Label(), err))
		}
	}
	if p.probeShutdown != nil {
		p.probeShutdown()
	}
	return errors.Join(errs...)
}

// Devices lists the pool's devices, a lazily created CPU fallback included.
func (p *Pool) Devices() []Device {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]Device, len(p.devices))
	for i, d := range p.devices {
		out[i] = d.dev
	}
	return out
}

// live reports whether d can take work now.
func (d *device) live() bool { return !d.degraded }

// reconcileLocked makes sure every queued batch has a device that may run
// it. If none does, a CPU engine is created (once, in the background) when
// CPUFallback allows (ModeAuto) and no CPU device exists; otherwise (ModeCUDA)
// the batch's call fails loudly rather than waiting forever.
func (p *Pool) reconcileLocked() {
	needCPU := false
	for _, b := range p.queue.snapshot() {
		if b.req.finished || p.runnableLocked(b) {
			continue
		}
		if p.cfg.fallsBackToCPU() && !p.hasCPULocked() {
			needCPU = true
			continue
		}
		err := fmt.Errorf("gpupool: no device can run a batch of %d pairs (tried %s)", len(b.idx), p.labelsLocked(b.avoid))
		if b.lastErr != nil {
			err = fmt.Errorf("%w: last error: %w", err, b.lastErr)
		}
		p.failLocked(b.req, err)
	}
	if needCPU && !p.creatingCPU {
		p.creatingCPU = true
		// The creating goroutine counts as a worker so Close's drain and the
		// engine closer wait for it.
		p.wg.Add(1)
		go p.createFallback()
	}
}

func (p *Pool) runnableLocked(b *batch) bool {
	for _, d := range p.devices {
		if d.live() && !slices.Contains(b.avoid, d.slot) {
			return true
		}
	}
	return false
}

func (p *Pool) hasCPULocked() bool {
	return slices.ContainsFunc(p.devices, func(d *device) bool { return d.dev.Kind == CPU })
}

func (p *Pool) labelsLocked(slots []int) string {
	s := ""
	for i, slot := range slots {
		if i > 0 {
			s += ","
		}
		s += p.devices[slot].dev.Label()
	}
	return s
}

// createFallback opens the lazy CPU engine outside the lock (it can take
// seconds) and starts its workers; on failure the stranded calls fail.
func (p *Pool) createFallback() {
	defer p.wg.Done()
	dev := Device{Kind: CPU, Name: "cpu"}
	eng, err := p.factory(dev)
	p.mu.Lock()
	defer p.mu.Unlock()
	p.creatingCPU = false
	if err != nil {
		p.log.Error().Err(err).Msg("gpupool: no GPU can run the work and the CPU fallback failed to open")
		for _, b := range p.queue.snapshot() {
			if !b.req.finished && !p.runnableLocked(b) {
				p.failLocked(b.req, fmt.Errorf("gpupool: no GPU can run the work and opening the CPU fallback failed: %w", err))
			}
		}
		return
	}
	if p.abortCtx.Err() != nil {
		_ = eng.Close()
		return
	}
	d := p.addDeviceLocked(dev, eng, MemoryModel{}, true)
	p.stats.Fallbacks++
	p.m.fallbacks.Inc()
	p.log.Warn().Msg("gpupool: no GPU can run the work, falling back to a CPU engine")
	p.startWorkersLocked(d)
	p.wakeWorkersLocked()
}
