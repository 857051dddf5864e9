package gpupool

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/scorer/scorer/model"
)

// memEstimate is a GPU's memory model: running a batch of rows × len padded
// tokens needs about base + perToken·rows·len bytes beyond the weights.
type memEstimate struct {
	base, perToken float64
	// weights is what opening the engine took; usedBase is device memory
	// in use right after that, before any batch ran.
	weights, usedBase uint64
	// arena is the memory calibration left in ORT's arena (the largest
	// warm-up batch's footprint), reusable by later batches.
	arena      float64
	calibrated bool
}

func (e memEstimate) bytes(tokens int) float64 {
	return max(0, e.base+e.perToken*float64(tokens))
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
func (p *Pool) admit(d *device, tokens int) admission {
	est := d.est.bytes(tokens)
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
	head := float64(p.cfg.headroom)
	// Other tenants come and go, so only our own weights count against
	// what the device could ever give a batch.
	if float64(d.est.weights)+est+head > limit {
		return admission{reason: "too_large", est: est, neverFits: true}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	// What our arena holds: growth since the engine opened, but never more
	// than the largest footprint we caused, since other tenants grow too.
	held := min(max(0, float64(used)-float64(d.est.usedBase)), d.arenaPeak)
	// need is what the batch adds to used memory: the arena's idle part
	// (held less what running batches reserve) is credited here, so the
	// checks below count those bytes once, inside used.
	need := max(0, est-max(0, held-d.reserved))
	switch {
	case need == 0:
		d.reserved += est
		return admission{ok: true, reason: "arena", est: est}
	case float64(free) < need+head:
		return admission{reason: "free_memory", est: est}
	case float64(used)+need > limit:
		return admission{reason: "mem_fraction", est: est}
	}
	d.reserved += est
	d.arenaPeak = max(d.arenaPeak, d.reserved)
	return admission{ok: true, reason: "fits", est: est}
}

func (p *Pool) reserve(d *device, a admission) admission {
	p.mu.Lock()
	d.reserved += a.est
	d.arenaPeak = max(d.arenaPeak, d.reserved)
	p.mu.Unlock()
	return a
}

// updateHeat reads utilization and throttle reasons and moves d between
// cool and hot with hysteresis: hot at HotUtilization or any power/thermal
// throttle, cool again only under CoolUtilization with no throttling, so a
// device near the threshold does not flap. Unsupported readings count as
// cool.
func (p *Pool) updateHeat(d *device) {
	util, uerr := p.probe.Utilization(d.dev.Index)
	reasons, terr := p.probe.Throttled(d.dev.Index)
	throttled := terr == nil && reasons&throttleHotMask != 0
	p.mu.Lock()
	defer p.mu.Unlock()
	was := d.hot
	switch {
	case throttled || (uerr == nil && util >= p.cfg.hotUtilization):
		d.hot = true
	case !throttled && (uerr != nil || util < p.cfg.coolUtilization):
		d.hot = false
	}
	if d.hot != was {
		p.log.Info().Str("device", d.dev.Label()).Bool("hot", d.hot).Uint32("utilization", util).
			Uint64("throttle_reasons", reasons).Msg("gpupool: device heat changed")
	}
}

// defaultShapes is the calibration ladder: one small batch, then a batch
// filling the token budget at several lengths up to maxLen, in increasing
// size so the arena's growth after each is that batch's footprint.
func defaultShapes(maxTokens, maxRows, maxLen int) []Shape {
	out := []Shape{{Rows: 1, Len: min(32, maxLen)}}
	for _, l := range []int{64, 128, 256, maxLen} {
		if l > maxLen {
			continue
		}
		rows := max(1, min(maxRows, maxTokens/l))
		out = append(out, Shape{Rows: rows, Len: l})
	}
	slices.SortStableFunc(out, func(a, b Shape) int { return a.Rows*a.Len - b.Rows*b.Len })
	return slices.Compact(out)
}

// calibrate learns dev's memory model by running warm-up batches of rising
// size and fitting bytes ≈ a + b·tokens by least squares to the growth of
// used memory after each. Without a usable fit it keeps the configured
// fallback estimate and says so. An error other than OOM means the engine
// cannot run on this device, so the device is not used.
//
// Memory is measured per process where the probe can (ProcessMemoryReader
// lists this process), so a second process calibrating on the same GPU at
// the same time does not leak into the fit; otherwise device-wide used
// memory is read, and the log says which. Shapes never exceed
// Calibration.MaxLen nor the engine's own maximum length (engineMaxLength),
// because the engine rejects longer pairs.
func (p *Pool) calibrate(ctx context.Context, dev Device, eng Engine, usedBefore uint64) (memEstimate, error) {
	cal := p.cfg.calibration
	est := memEstimate{base: float64(cal.FallbackBase), perToken: float64(cal.FallbackPerToken)}
	_, used0, _, err := p.probe.MemoryInfo(dev.Index)
	if err != nil {
		if errors.Is(err, ErrGPULost) {
			return est, fmt.Errorf("gpupool: %s: %w", dev.Label(), err)
		}
		p.log.Warn().Err(err).Str("device", dev.Label()).Msg("gpupool: no memory reading, using fallback memory estimate")
		return est, nil
	}
	est.usedBase = used0
	if used0 > usedBefore {
		est.weights = used0 - usedBefore
	}
	read := func() (uint64, error) {
		_, used, _, err := p.probe.MemoryInfo(dev.Index)
		return used, err
	}
	base := used0
	if pr, mine, ok := p.processMemory(dev); ok {
		// All this process holds on the GPU is what opening the engine
		// took (more only if it already used the GPU: the safe side).
		read = func() (uint64, error) { return pr.ProcessMemory(dev.Index) }
		base, est.weights = mine, mine
	}
	if cal.Disabled {
		return est, nil
	}
	// The engine's own limit wins where it states one, so a caller that
	// left MaxLen at its default cannot lose the GPU to it.
	maxLen := cal.MaxLen
	if n := engineMaxLength(eng); n > 0 {
		maxLen = min(maxLen, n)
	}
	shapes := clampShapes(cal.Shapes, maxLen)
	if len(shapes) == 0 {
		shapes = defaultShapes(p.cfg.maxBatchTokens, p.cfg.maxBatchRows, maxLen)
	}
	var xs, ys []float64
	for _, s := range shapes {
		pairs := syntheticPairs(s, cal.TokenID)
		if _, err := eng.ScorePairs(ctx, pairs); err != nil {
			if errors.Is(err, model.ErrOutOfMemory) {
				p.log.Warn().Err(err).Str("device", dev.Label()).Int("rows", s.Rows).Int("len", s.Len).
					Msg("gpupool: calibration batch ran out of memory; fitting the smaller ones")
				break
			}
			return est, fmt.Errorf("gpupool: %s: calibration batch %dx%d: %w", dev.Label(), s.Rows, s.Len, err)
		}
		used, err := read()
		if err != nil {
			break
		}
		xs = append(xs, float64(s.Rows*s.Len))
		ys = append(ys, float64(used)-float64(base))
	}
	a, b, ok := fitLine(xs, ys)
	if !ok || b <= 0 {
		p.log.Warn().Str("device", dev.Label()).Int("points", len(xs)).
			Msg("gpupool: calibration gave no usable fit, using fallback memory estimate")
		return est, nil
	}
	est.base, est.perToken, est.calibrated = max(0, a), b, true
	est.arena = slices.Max(ys)
	return est, nil
}

// processMemory returns the probe's per-process reader and this process's
// memory on dev now, when the probe offers such readings and lists us, and
// logs which way calibration measures memory.
func (p *Pool) processMemory(dev Device) (ProcessMemoryReader, uint64, bool) {
	pr, ok := p.probe.(ProcessMemoryReader)
	if !ok {
		p.log.Info().Str("device", dev.Label()).Str("memory_reading", "device").
			Msg("gpupool: calibration reads device-wide used memory (no per-process readings)")
		return nil, 0, false
	}
	used, err := pr.ProcessMemory(dev.Index)
	if err != nil {
		p.log.Info().Str("device", dev.Label()).Str("memory_reading", "device").Err(err).
			Msg("gpupool: calibration reads device-wide used memory; other processes allocating meanwhile skew it")
		return nil, 0, false
	}
	p.log.Info().Str("device", dev.Label()).Str("memory_reading", "process").Uint64("process_used_bytes", used).
		Msg("gpupool: calibration reads this process's own GPU memory")
	return pr, used, true
}

// clampShapes limits configured calibration shapes to maxLen tokens per
// pair; longer pairs are rejected by the engine, which would drop the GPU.
func clampShapes(shapes []Shape, maxLen int) []Shape {
	out := make([]Shape, len(shapes))
	for i, s := range shapes {
		out[i] = Shape{Rows: s.Rows, Len: min(s.Len, maxLen)}
	}
	return out
}

// syntheticPairs builds a batch of the given shape. Memory depends on shape,
// not content, so any valid token ID will do.
func syntheticPairs(s Shape, id int32) []model.Pair {
	pairs := make([]model.Pair, s.Rows)
	for i := range pairs {
		ids := make([]int32, s.Len)
		for j := range ids {
			ids[j] = id
		}
		pairs[i] = model.Pair{IDs: ids, TypeIDs: make([]int32, s.Len)}
	}
	return pairs
}

// fitLine is ordinary least squares for y = a + b·x; ok is false with fewer
// than two distinct x values.
func fitLine(xs, ys []float64) (a, b float64, ok bool) {
	n := float64(len(xs))
	if len(xs) < 2 {
		return 0, 0, false
	}
	var sx, sy, sxx, sxy float64
	for i := range xs {
		sx += xs[i]
		sy += ys[i]
		sxx += xs[i] * xs[i]
		sxy += xs[i] * ys[i]
	}
	den := n*sxx - sx*sx
	if den == 0 {
		return 0, 0, false
	}
	b = (n*sxy - sx*sy) / den
	a = (sy - b*sx) / n
	return a, b, true
}
