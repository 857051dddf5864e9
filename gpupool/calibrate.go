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

// defaultShapes is the calibration ladder: the shapes the planner builds,
// every length bucket up to maxLen at the rows the token budget gives it
// (capped at maxRows), so the fit is made where admission uses it; and a
// quarter of those rows at the shortest, a middle and the longest length,
// so the per-batch intercept is seen apart from the per-row and per-token
// terms (at full rows, rows·len is nearly the budget at every length). In
// increasing size, so an engine that cannot release its arena between
// shapes still reads each shape's own footprint as its growth. The first
// GPU run's ladder measured short lengths only at 32 rows (50-100 MiB), and
// the fit under-predicted the planner's 341×48 batches by 20-35%. Three
// more shapes are at lengths that are not multiples of 8 (see below).
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
	// Full rows at lengths that are not multiples of 8, short, middle and
	// long: ONNX Runtime's CUDA attention runs its fused kernels only at
	// multiples of 8 (fp16) and an unfused path with 2·rows·heads·len² of
	// scratch otherwise, which a ladder of multiples of 16 never measured.
	// With PAD_TO_MULTIPLE_OF=8 they run padded (padShapes) and measure
	// the padded shapes batches then run at.
	for _, l := range []int{33, lens[len(lens)/2] + 1, maxLen - 1} {
		for l%8 == 0 {
			l--
		}
		if l > 0 && l < maxLen {
			out = append(out, Shape{Rows: rowsAt(l), Len: l})
		}
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
// a fit measured here is kept for the next start, unless it was read
// device-wide while another process moved the device's memory.
//
// Memory is measured per process where the probe can (ProcessMemoryReader
// lists this process), so a second process calibrating on the same GPU at
// the same time does not leak into the fit, which is kept whatever else
// runs there; otherwise device-wide used memory is read, and the log says
// which. Shapes never exceed
// Calibration.MaxLen nor the engine's own maximum length (engineMaxLength),
// because the engine rejects longer pairs.
func (p *Pool) calibrate(ctx context.Context, dev Device, eng Engine, usedBefore uint64, workers int) (MemoryModel, error) {
	cal := p.cfg.calibration
	est := MemoryModel{Base: float64(cal.FallbackBase), PerToken: float64(cal.FallbackPerToken), BesideArenaBytes: DefaultGPUMemMargin}
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
		est.WeightBytes = used0 - usedBefore
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
		base, est.WeightBytes = mine, mine
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
	// Measured, fitted and kept at the lengths the engine runs them at.
	shapes = padShapes(eng, shapes)
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
		est.Base, est.PerRow, est.PerToken, est.PerTokenLen, est.HeldOut, est.Calibrated =
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
	// A device-wide reading counts every process on the GPU. Taken with our
	// arena empty it is what the GPU holds beside our batches, which nothing
	// of ours moves once the warm-up ran: where it moved during the ladder,
	// another process allocated or freed meanwhile, in the readings of some
	// shapes and not others. The fit serves this start (the median of three
	// readings per shape leaves out one such event) but is not kept, so no
	// later start inherits the skew. A process that only sits on the GPU
	// moves nothing: every reading is a difference. NVML's process list
	// cannot tell instead: inside a PID namespace our own entry, under its
	// host PID, looks like any other process's. emptyLo and emptyHi are the
	// range of these readings.
	emptyLo, emptyHi := uint64(math.MaxUint64), uint64(0)
	noteEmpty := func(used uint64) { emptyLo, emptyHi = min(emptyLo, used), max(emptyHi, used) }
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
			noteEmpty(start)
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
	if fit.HeldOut >= maxHeldOut {
		p.log.Warn().Str("device", dev.Label()).Float64("held_out_error", fit.HeldOut).
			Msg("gpupool: the memory model misses calibration shapes it was not fitted on by half or more; estimates carry the capped margin")
	}
	est.Base, est.PerRow, est.PerToken, est.PerTokenLen, est.HeldOut, est.Calibrated =
		fit.Base, fit.PerRow, fit.PerToken, fit.PerTokenLen, fit.HeldOut, true
	// One more reading with the arena empty vouches for the last shape's
	// runs, which no later shape's start reading follows.
	checked := false
	if cache != nil && !perProcess && canRelease && rel.ReleaseArena(ctx) == nil {
		if used, err := read(); err == nil {
			noteEmpty(used)
			checked = true
		}
	}
	file := ""
	switch {
	case cache == nil:
	case rel != nil && !canRelease:
		// The key says the shapes were measured from an emptied arena;
		// these were high-water marks.
		miss += "; not kept: the arena could not be emptied between shapes"
	case !perProcess && !canRelease:
		miss += "; not kept: device-wide used memory read as high-water marks cannot tell another process's allocations from ours"
	case !perProcess && !checked:
		miss += "; not kept: device-wide used memory could not be read with the arena empty after the last shape, so another process's allocations cannot be ruled out"
	case !perProcess && emptyHi-emptyLo > quietSlack:
		miss += fmt.Sprintf("; not kept: device-wide used memory with our arena empty moved by %d MiB during calibration: another process allocated or freed on this GPU, and its memory is in the readings",
			(emptyHi-emptyLo)>>20)
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
		// shape's footprint only, or nothing where the reading that vouches
		// for the last shape emptied it again.
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
func (p *Pool) besideInto(ctx context.Context, dev Device, est *MemoryModel, eng Engine, rel ArenaReleaser, read func() (uint64, error), base uint64, workers int) bool {
	beside, err := p.measureBeside(ctx, eng, rel, read, base, workers, p.cfg.calibration.TokenID)
	if err != nil {
		p.log.Warn().Err(err).Str("device", dev.Label()).Float64("assumed_bytes", est.BesideArenaBytes).
			Msg("gpupool: cannot measure the memory CUDA takes beside the arena; admission assumes the floor")
		return false
	}
	// The arena is empty again: what is left beside the weights is CUDA's
	// own. Below the floor is believed: per-process readings count the
	// context created at open as weights already.
	est.BesideArenaBytes, est.BesideArenaMeasured = beside, true
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

// quietSlack is how far device-wide readings with our arena empty may
// move for a calibration to count as alone on the GPU (calibrate): CUDA
// maps device memory in 2 MiB pages, and one page either way is a few per
// cent of the smallest calibration shape of a production-size model. Not
// yet measured on a GPU: should our own process move it further (kernels
// loaded on first use by a larger shape), every start logs "not kept" with
// the figure and calibrates, as with the cache off.
const quietSlack = 2 << 20

// errNoReading stops calibration when memory can no longer be read.
var errNoReading = errors.New("gpupool: memory reading failed during calibration")

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
