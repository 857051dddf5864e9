package gpupool

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"

	"github.com/scorer/scorer/model"
)

// memEstimate is a device's memory model: running a batch of rows × len
// padded tokens needs about base + perRow·rows + perToken·rows·len +
// perTokenLen·rows·len² bytes beyond the weights. The len² term is
// attention: every layer holds rows·heads·len² scores (and their softmax) at
// once, which for long pairs outgrows everything linear in the tokens. The
// per-row term is what a row costs whatever its length: DeBERTa-v3's
// relative-position Tile on the first GPU run (0.7 MiB fp16, 2.6 MiB fp32),
// without which short batches of many rows were under-predicted by 20-35%.
type memEstimate struct {
	base, perRow, perToken, perTokenLen float64
	// heldOut is the fit's largest under-prediction of a calibration
	// shape it was not fitted on (leave one out): added to every estimate
	// on top of fragmentationMargin, so shapes between and beyond the
	// calibration ladder are not under-predicted by the fit's own error.
	heldOut float64
	// weights is what opening the engine took; usedBase is device memory
	// in use right after that, before any batch ran.
	weights, usedBase uint64
	// beside is what the process holds on the device beyond weights and
	// arena once every worker has run: the CUDA context's growth on first
	// use and each concurrent run's cuBLAS/cuDNN workspace. besideMeasured
	// is false while it is still the DefaultGPUMemMargin floor.
	beside         float64
	besideMeasured bool
	// arena is the memory calibration left in ORT's arena (the largest
	// warm-up batch's footprint), reusable by later batches.
	arena      float64
	calibrated bool
}

// fragmentationMargin is added to every estimate: a BFC arena serves a
// request from a free chunk at least as large, so a run can need more than
// its tensors' sum when the free space is split (kSameAsRequested growth
// keeps this small, not zero).
const fragmentationMargin = 0.10

// factor is what every estimate is multiplied by.
func (e memEstimate) factor() float64 { return (1 + fragmentationMargin) * (1 + e.heldOut) }

// bytes is what a rows × length batch needs, margins included: what
// admission reserves for it.
func (e memEstimate) bytes(rows, length int) float64 {
	r, l := float64(rows), float64(length)
	return max(0, e.base+e.perRow*r+e.perToken*r*l+e.perTokenLen*r*l*l) * e.factor()
}

// maxRows is the most rows of length tokens whose estimate fits in room
// bytes; 0 when not even one row does.
func (e memEstimate) maxRows(length int, room float64) int {
	l := float64(length)
	per := (e.perRow + e.perToken*l + e.perTokenLen*l*l) * e.factor()
	avail := room - max(0, e.base)*e.factor()
	if per <= 0 || avail <= 0 {
		return 0
	}
	return int(min(avail/per, 1<<30))
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
	est := d.est.bytes(rows, length)
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
	p.mu.Lock()
	defer p.mu.Unlock()
	budget := p.budgetLocked(d)
	// Other tenants come and go, so only our own weights and CUDA's
	// memory beside the arena count against what the device could ever
	// give a batch.
	if float64(d.est.weights)+d.est.beside+est+head > min(limit, budget) {
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
	own := float64(d.est.weights) + d.est.beside + max(d.arenaPeak, d.reserved+est)
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

// budgetLocked is this process's memory budget on d: GPU_MEM_LIMIT, or
// MemFraction of the device when no limit is set, and never above
// MemFraction.
func (p *Pool) budgetLocked(d *device) float64 {
	limit := p.cfg.memFraction * float64(d.dev.TotalMemory)
	if b := p.cfg.memLimit.Of(d.dev.TotalMemory); b > 0 {
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

// defaultShapes is the calibration ladder: the shapes the planner builds,
// every length bucket up to maxLen at the rows the token budget gives it
// (capped at maxRows), so the fit is made where admission uses it; and a
// quarter of those rows at the shortest, a middle and the longest length,
// so the per-batch intercept is seen apart from the per-row and per-token
// terms (at full rows, rows·len is nearly the budget at every length). In
// increasing size, so an engine that cannot release its arena between
// shapes still reads each shape's own footprint as its growth. The first
// GPU run's ladder measured short lengths only at 32 rows (50-100 MiB), and
// the fit under-predicted the planner's 341×48 batches by 20-35%.
func defaultShapes(maxTokens, maxRows, maxLen int) []Shape {
	rowsAt := func(l int) int { return max(1, min(maxRows, maxTokens/l)) }
	var lens []int
	for _, l := range []int{16, 32, 48, 64, 96, 128, 192, 256, 384, 512} {
		if l < maxLen {
			lens = append(lens, l)
		}
	}
	lens = append(lens, maxLen)
	var out []Shape
	for _, l := range lens {
		out = append(out, Shape{Rows: rowsAt(l), Len: l})
	}
	for _, l := range []int{lens[0], lens[len(lens)/2], maxLen} {
		out = append(out, Shape{Rows: max(1, rowsAt(l)/4), Len: l})
	}
	slices.SortStableFunc(out, func(a, b Shape) int {
		if c := a.Rows*a.Len - b.Rows*b.Len; c != 0 {
			return c
		}
		return a.Len - b.Len
	})
	return slices.Compact(out)
}

// ArenaReleaser is an optional Engine extension: ReleaseArena returns the
// memory the engine's arena holds but no tensor uses to the device
// (model.Session does it with ORT's arena-shrinkage run option).
// Calibration calls it before each shape so every shape is measured from
// an empty arena rather than on top of the largest shape before it.
type ArenaReleaser interface {
	ReleaseArena(ctx context.Context) error
}

// calibrate learns dev's memory model: after one small run that absorbs
// CUDA's one-off initialisation, it runs each calibration shape from an
// emptied arena (ArenaReleaser; otherwise in rising size, reading the
// arena's high-water mark) and fits the memory each shape added
// (fitActivations). A shape that runs out of memory is left out. Without a
// usable fit it keeps the configured fallback estimate and says so. Where
// the engine can empty its arena it then measures what CUDA holds beside
// it once workers runs went at once (measureBeside); until then, or
// without that, admission counts DefaultGPUMemMargin there. An error other
// than OOM means the engine cannot run on this device, so the device is
// not used. A fit kept by an earlier start under the same key
// (GPUCalibrationCache, gpuFitCache) replaces the warm-up and the shapes;
// a fit measured here is kept for the next start.
//
// Memory is measured per process where the probe can (ProcessMemoryReader
// lists this process), so a second process calibrating on the same GPU at
// the same time does not leak into the fit; otherwise device-wide used
// memory is read, and the log says which. Shapes never exceed
// Calibration.MaxLen nor the engine's own maximum length (engineMaxLength),
// because the engine rejects longer pairs.
func (p *Pool) calibrate(ctx context.Context, dev Device, eng Engine, usedBefore uint64, workers int) (memEstimate, error) {
	cal := p.cfg.calibration
	est := memEstimate{base: float64(cal.FallbackBase), perToken: float64(cal.FallbackPerToken), beside: DefaultGPUMemMargin}
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
	pr, mine, perProcess := p.processMemory(dev)
	if perProcess {
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
	rel, canRelease := eng.(ArenaReleaser)
	cache, miss := p.gpuFitCache(dev, eng, shapes, perProcess, canRelease)
	var kept gpuFit
	if cache != nil {
		kept, miss = loadFit[gpuFit](cache)
	}
	cached := cache != nil && miss == ""
	if canRelease || cached {
		// One small run first: CUDA's lazy initialisation (cuBLAS handles,
		// kernels) costs memory once, and must not land in the intercept
		// of every batch. With a kept fit it is all that still proves the
		// engine runs on this device, as the ladder would have (an error
		// other than OOM drops the device).
		warm := Shape{Rows: 1, Len: min(8, maxLen)}
		if _, err := eng.ScorePairs(ctx, syntheticPairs(warm, cal.TokenID)); err != nil {
			return est, fmt.Errorf("gpupool: %s: calibration warm-up: %w", dev.Label(), err)
		}
	}
	if cached {
		est.base, est.perRow, est.perToken, est.perTokenLen, est.heldOut, est.calibrated =
			kept.Base, kept.PerRow, kept.PerToken, kept.PerTokenLen, kept.HeldOut, true
		// Only the fit is kept. The weights and used memory above were
		// read now, as they must be: other tenants and this start's CUDA
		// context are in them. What CUDA takes beside the arena is measured
		// again too: it is a few one-row runs, and a kept figure would miss
		// a driver or a worker count that changed it, where an under-count
		// is an OOM. The arena holds what those runs left, none once
		// measured.
		if !canRelease || !p.besideInto(ctx, dev, &est, eng, rel, read, base, workers) {
			if used, err := read(); err == nil {
				est.arena = max(0, float64(used)-float64(base))
			}
		}
		p.log.Info().Str("device", dev.Label()).Str("uuid", dev.UUID).Str("file", cache.path).
			Msg("gpupool: GPU memory calibration taken from cache: measured at an earlier start with the same GPU, model, ONNX Runtime, session options and shapes")
		return est, nil
	}
	// measure runs one shape from an emptied arena (where the engine can
	// release it) and returns the memory it added and used memory after.
	measure := func(s Shape) (y float64, used uint64, err error) {
		start := base
		if canRelease {
			if err := rel.ReleaseArena(ctx); err != nil {
				p.log.Warn().Err(err).Str("device", dev.Label()).Msg("gpupool: cannot release the arena between calibration shapes; readings are high-water marks")
				canRelease = false
			} else if start, err = read(); err != nil {
				return 0, 0, errNoReading
			}
		}
		if _, err := eng.ScorePairs(ctx, syntheticPairs(s, cal.TokenID)); err != nil {
			return 0, 0, err
		}
		if used, err = read(); err != nil {
			return 0, 0, errNoReading
		}
		return float64(used) - float64(start), used, nil
	}
	// Device-wide readings include every other process: a neighbour that
	// allocates or frees while a shape runs moves that reading. Three
	// readings per shape and their median ignore one such event, so a
	// neighbour's burst neither inflates nor (worse) shrinks the fit.
	reps := 1
	if !perProcess && canRelease {
		reps = 3
	}
	var pts []memPoint
	var peak float64
shapes:
	for _, s := range shapes {
		var ys []float64
		for range reps {
			y, used, err := measure(s)
			switch {
			case errors.Is(err, errNoReading):
				break shapes
			case errors.Is(err, model.ErrOutOfMemory):
				p.log.Warn().Err(err).Str("device", dev.Label()).Int("rows", s.Rows).Int("len", s.Len).
					Msg("gpupool: calibration batch ran out of memory; fitting the others")
				continue shapes
			case err != nil:
				return est, fmt.Errorf("gpupool: %s: calibration batch %dx%d: %w", dev.Label(), s.Rows, s.Len, err)
			}
			ys = append(ys, y)
			peak = max(peak, float64(used)-float64(base))
		}
		slices.Sort(ys)
		pts = append(pts, memPoint{rows: s.Rows, length: s.Len, bytes: ys[len(ys)/2]})
	}
	fit, ok := fitActivations(pts)
	if !ok {
		p.log.Warn().Str("device", dev.Label()).Int("points", len(pts)).
			Msg("gpupool: calibration gave no usable fit, using fallback memory estimate")
		return est, nil
	}
	if fit.heldOut >= maxHeldOut {
		p.log.Warn().Str("device", dev.Label()).Float64("held_out_error", fit.heldOut).
			Msg("gpupool: the memory model misses calibration shapes it was not fitted on by half or more; estimates carry the capped margin")
	}
	est.base, est.perRow, est.perToken, est.perTokenLen, est.heldOut, est.calibrated =
		fit.base, fit.perRow, fit.perToken, fit.perTokenLen, fit.heldOut, true
	file := ""
	switch {
	case cache == nil:
	case rel != nil && !canRelease:
		// The key says the shapes were measured from an emptied arena;
		// these were high-water marks.
		miss += "; not kept: the arena could not be emptied between shapes"
	default:
		if err := storeFit(cache, gpuFitOf(est), pts); err != nil {
			miss += "; not kept: " + err.Error()
		} else {
			file = cache.path
		}
	}
	p.log.Info().Str("device", dev.Label()).Str("uuid", dev.UUID).Str("file", file).Int("shapes", len(pts)).
		Msgf("gpupool: GPU memory calibrated (cache miss: %s)", miss)
	if canRelease {
		// The arena was emptied before the last shape; it now holds that
		// shape's footprint only.
		if used, err := read(); err == nil {
			peak = max(0, float64(used)-float64(base))
		}
		if p.besideInto(ctx, dev, &est, eng, rel, read, base, workers) {
			peak = 0
		}
	}
	est.arena = peak
	return est, nil
}

// besideInto measures what CUDA holds beside the arena (measureBeside) into
// est, or logs why it cannot and leaves the floor there; true when it
// measured, which leaves the arena empty.
func (p *Pool) besideInto(ctx context.Context, dev Device, est *memEstimate, eng Engine, rel ArenaReleaser, read func() (uint64, error), base uint64, workers int) bool {
	beside, err := p.measureBeside(ctx, eng, rel, read, base, workers, p.cfg.calibration.TokenID)
	if err != nil {
		p.log.Warn().Err(err).Str("device", dev.Label()).Float64("assumed_bytes", est.beside).
			Msg("gpupool: cannot measure the memory CUDA takes beside the arena; admission assumes the floor")
		return false
	}
	// The arena is empty again: what is left beside the weights is CUDA's
	// own. Below the floor is believed: per-process readings count the
	// context created at open as weights already.
	est.beside, est.besideMeasured = beside, true
	// Admission credits used memory's growth past usedBase as our arena;
	// CUDA's own growth is not arena a batch can reuse.
	est.usedBase += uint64(beside)
	return true
}

// measureBeside runs one small batch per worker at once, empties the arena
// and returns what the process then holds beyond base: the CUDA context's
// growth on first use and every concurrent run's own cuBLAS/cuDNN
// workspace, which ORT's gpu_mem_limit does not cap and admission must
// count (667 MiB fp16, 764 MiB fp32 on the first GPU run, beside a 512 MiB
// margin). The runs go at once because a run on its own can reuse the
// previous run's thread and workspace, as one worker's runs do; two workers
// running at once cannot.
func (p *Pool) measureBeside(ctx context.Context, eng Engine, rel ArenaReleaser, read func() (uint64, error), base uint64, workers int, id int32) (float64, error) {
	pairs := syntheticPairs(Shape{Rows: 1, Len: 8}, id)
	errs := make([]error, max(1, workers))
	var wg sync.WaitGroup
	for i := range errs {
		wg.Go(func() { _, errs[i] = eng.ScorePairs(ctx, pairs) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return 0, err
	}
	if err := rel.ReleaseArena(ctx); err != nil {
		return 0, err
	}
	used, err := read()
	if err != nil {
		return 0, err
	}
	return max(0, float64(used)-float64(base)), nil
}

// errNoReading stops calibration when memory can no longer be read.
var errNoReading = errors.New("gpupool: memory reading failed during calibration")

// memPoint is one calibration reading: a rows × length batch needed bytes.
type memPoint struct {
	rows, length int
	bytes        float64
}

// maxHeldOut caps the held-out safety margin: a fit that misses a shape it
// was not fitted on by more than this is wrong, not uncertain, and the log
// says so rather than every batch reserving double.
const maxHeldOut = 0.5

// fitActivations fits bytes ≈ a + d·rows + b·rows·len + c·rows·len² to a
// GPU's calibration points, each weighted by 1/bytes so that the fit
// minimises relative error: unweighted, the GiB-sized long batches decide
// and the short ones come out a fifth to a third under. A growth term whose
// coefficient would come out negative is left out (it extrapolates to an
// under-prediction): of the subsets of {d, b, c} whose coefficients are all
// non-negative, the one with the smallest relative error wins, so the full
// model whenever it is. heldOut is the largest under-prediction, relative
// to the reading, of a point by the fit on all the others (leave one out):
// what the fit may miss at a shape it has not seen, capped at maxHeldOut.
// ok is false when no subset has a positive growth term.
func fitActivations(pts []memPoint) (memEstimate, bool) {
	est, ok := fitRelative(pts)
	if !ok {
		return memEstimate{}, false
	}
	for i, pt := range pts {
		if pt.bytes <= 0 {
			continue
		}
		rest := append(slices.Clone(pts[:i]), pts[i+1:]...)
		if e, ok := fitRelative(rest); ok {
			under := (pt.bytes - e.bytes(pt.rows, pt.length)/e.factor()) / pt.bytes
			est.heldOut = min(maxHeldOut, max(est.heldOut, under))
		}
	}
	return est, true
}

// fitRelative is fitActivations without the held-out margin.
func fitRelative(pts []memPoint) (memEstimate, bool) {
	var top float64
	for _, pt := range pts {
		top = max(top, pt.bytes)
	}
	if top <= 0 {
		return memEstimate{}, false
	}
	// A reading of nothing (noise around a tiny shape) would get an
	// infinite weight; a thousandth of the largest bounds it.
	floor := top / 1000
	term := func(k int, pt memPoint) float64 {
		r, l := float64(pt.rows), float64(pt.length)
		return [...]float64{1, r, r * l, r * l * l}[k]
	}
	var best memEstimate
	bestErr := math.Inf(1)
	for mask := 1; mask < 8; mask++ {
		cols := []int{0}
		for k := 1; k <= 3; k++ {
			if mask&(1<<(k-1)) != 0 {
				cols = append(cols, k)
			}
		}
		if len(pts) < len(cols) {
			continue
		}
		x := make([][]float64, len(pts))
		y := make([]float64, len(pts))
		for i, pt := range pts {
			w := 1 / max(pt.bytes, floor)
			x[i] = make([]float64, len(cols))
			for j, k := range cols {
				x[i][j] = term(k, pt) * w
			}
			y[i] = pt.bytes * w
		}
		coef, ok := leastSquares(x, y)
		if !ok || slices.ContainsFunc(coef[1:], func(v float64) bool { return v < 0 }) {
			continue
		}
		var e memEstimate
		terms := [...]*float64{&e.base, &e.perRow, &e.perToken, &e.perTokenLen}
		for j, k := range cols {
			*terms[k] = coef[j]
		}
		e.base = max(0, e.base)
		if e.perRow <= 0 && e.perToken <= 0 && e.perTokenLen <= 0 {
			continue
		}
		var sse float64
		for _, pt := range pts {
			d := (e.bytes(pt.rows, pt.length)/e.factor() - pt.bytes) / max(pt.bytes, floor)
			sse += d * d
		}
		if sse < bestErr {
			best, bestErr = e, sse
		}
	}
	return best, !math.IsInf(bestErr, 1)
}

// leastSquares solves min |x·c − y| through the normal equations on
// columns scaled to unit maximum (rows·len² reaches 1e8 beside a constant
// 1, so unscaled normal equations lose every digit), by Gaussian
// elimination with partial pivoting; ok is false when the columns are
// (nearly) dependent.
func leastSquares(x [][]float64, y []float64) ([]float64, bool) {
	n := len(x[0])
	scale := make([]float64, n)
	for _, row := range x {
		for j, v := range row {
			scale[j] = max(scale[j], math.Abs(v))
		}
	}
	if slices.Contains(scale, 0) {
		return nil, false
	}
	// a is the augmented normal matrix [XᵀX | Xᵀy] of the scaled columns.
	a := make([][]float64, n)
	for j := range a {
		a[j] = make([]float64, n+1)
	}
	for i, row := range x {
		for j := range n {
			for k := range n {
				a[j][k] += row[j] / scale[j] * row[k] / scale[k]
			}
			a[j][n] += row[j] / scale[j] * y[i]
		}
	}
	diag := make([]float64, n)
	for j := range n {
		diag[j] = a[j][j]
	}
	for col := range n {
		piv := col
		for r := col + 1; r < n; r++ {
			if math.Abs(a[r][col]) > math.Abs(a[piv][col]) {
				piv = r
			}
		}
		a[col], a[piv] = a[piv], a[col]
		// A pivot this small against the column's own norm means the
		// column is a combination of the ones before it.
		if math.Abs(a[col][col]) < 1e-10*diag[col] {
			return nil, false
		}
		for r := col + 1; r < n; r++ {
			f := a[r][col] / a[col][col]
			for k := col; k <= n; k++ {
				a[r][k] -= f * a[col][k]
			}
		}
	}
	c := make([]float64, n)
	for j := n - 1; j >= 0; j-- {
		v := a[j][n]
		for k := j + 1; k < n; k++ {
			v -= a[j][k] * c[k]
		}
		c[j] = v / a[j][j]
	}
	for j := range c {
		c[j] /= scale[j]
	}
	return c, true
}

// fitMemory fits bytes ≈ a + b·rows·len + c·rows·len² by least squares.
// A negative c (no visible quadratic growth, or noise) falls back to the
// line a + b·rows·len, a negative b to a + c·rows·len²; ok is false when
// even the line has no positive slope.
func fitMemory(pts []memPoint) (a, b, c float64, ok bool) {
	xs := make([]float64, len(pts))
	qs := make([]float64, len(pts))
	ys := make([]float64, len(pts))
	lens := map[int]bool{}
	for i, pt := range pts {
		r, l := float64(pt.rows), float64(pt.length)
		xs[i], qs[i], ys[i] = r*l, r*l*l, pt.bytes
		lens[pt.length] = true
	}
	if len(lens) >= 3 {
		a, b, c, ok := fitPlane(xs, qs, ys)
		if ok && c >= 0 && b >= 0 && (b > 0 || c > 0) {
			return a, b, c, true
		}
		if ok && c > 0 && b < 0 {
			// Growth all in len² (a negative linear term is noise around
			// zero): a + c·rows·len², not a line that misses the curve.
			if a, c, ok := fitLine(qs, ys); ok && c > 0 {
				return a, 0, c, true
			}
		}
	}
	a, b, ok = fitLine(xs, ys)
	if !ok || b <= 0 {
		return 0, 0, 0, false
	}
	return a, b, 0, true
}

// fitPlane is least squares for y = a + b·x + c·q, solved on centred and
// scaled columns (x reaches 1e4 and q 1e7, so raw normal equations lose
// precision); ok is false when the columns are degenerate.
func fitPlane(xs, qs, ys []float64) (a, b, c float64, ok bool) {
	n := float64(len(xs))
	if len(xs) < 3 {
		return 0, 0, 0, false
	}
	mean := func(v []float64) float64 {
		s := 0.0
		for _, x := range v {
			s += x
		}
		return s / n
	}
	mx, mq, my := mean(xs), mean(qs), mean(ys)
	var sx, sq float64
	for i := range xs {
		sx = max(sx, math.Abs(xs[i]-mx))
		sq = max(sq, math.Abs(qs[i]-mq))
	}
	if sx == 0 || sq == 0 {
		return 0, 0, 0, false
	}
	var sxx, sxq, sqq, sxy, sqy float64
	for i := range xs {
		x, q, y := (xs[i]-mx)/sx, (qs[i]-mq)/sq, ys[i]-my
		sxx += x * x
		sxq += x * q
		sqq += q * q
		sxy += x * y
		sqy += q * y
	}
	det := sxx*sqq - sxq*sxq
	if math.Abs(det) < 1e-12*sxx*sqq {
		return 0, 0, 0, false
	}
	b = (sxy*sqq - sqy*sxq) / det / sx
	c = (sqy*sxx - sxy*sxq) / det / sq
	a = my - b*mx - c*mq
	return a, b, c, true
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
