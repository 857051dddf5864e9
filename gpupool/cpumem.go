package gpupool

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/rs/zerolog"

	"github.com/scorer/scorer/model"
)

// CPUMemoryConfig bounds the memory CPU batches take. A transformer's
// activations grow with rows·len (and, inside attention, rows·len²), so a
// batch of long pairs can need many times what a batch of ordinary
// sentences does: on the production-size DeBERTa, 16 rows of 512 tokens
// take about 1.7 GB per worker against 0.2 GB for 16 rows of 128. With this
// set, the pool learns the CPU engine's cost per batch at start (the GPU's
// memory model, bytes ≈ a + b·rows·len + c·rows·len², fitted to the
// process's peak resident memory over a few one-row batches) and the
// planner cuts each call's batches so that every batch's modelled memory
// stays within one worker's share: rows fall as length grows.
type CPUMemoryConfig struct {
	// Limit is the memory the whole process may use, in bytes (the
	// container's limit); 0 means none is known, and only BatchBytes bounds
	// a batch.
	Limit uint64
	// Reserve is what the process needs besides the engine and its batches
	// (score cache, input in flight, the Go heap); it is set aside from
	// Limit together with the baseline measured once the CPU engine is open:
	// the resident memory (weights, ONNX Runtime) and what the process has
	// mapped from data files and not read yet (weights ONNX Runtime maps,
	// which count once runs read them: the embedding table's rows, and
	// every prepacked weight of a session from GRAPH_CACHE). The rest is
	// split evenly between the CPU workers, which run at once.
	Reserve uint64
	// BatchBytes caps one batch's modelled memory. 0 means what
	// MaxBatchRows pairs of RefLen tokens need: a batch of long pairs then
	// takes no more memory than a full batch of ordinary sentences, so
	// memory no longer depends on what arrives, and on a CPU wider batches
	// of long pairs score no faster (each row is already hundreds of
	// tokens of work).
	BatchBytes uint64
	// RefLen is the pair length of the reference batch behind BatchBytes's
	// default (default 128 tokens: longer than 99% of real transcript
	// sentences with a label hypothesis).
	RefLen int
	// Shapes are the calibration batches (default one row at 32, 64, 128,
	// 256 and 512 tokens, below the engine's maximum length, the last ones
	// only while a shape takes under 250 ms): one row keeps the start-up
	// cost low (about 2 s of one core on the production-size model, where
	// the 512-token row is left out) and the fitted model scales in rows.
	Shapes []Shape
	// CacheDir, when set, keeps each calibration's fit in a small file
	// there, and a later start whose key matches takes it instead of
	// measuring again. The key is all the fit depends on: the engine's
	// MemoryKey (model.Session: the model's SHA-256 and maximum length,
	// ONNX Runtime's release, the session's threads and memory options;
	// an engine without one is never cached), how calibration measures
	// (named anew whenever that changes, so a fit measured by another
	// release's method is never taken), these settings, the C heap's
	// settings from the environment (MALLOC_*, GLIBC_TUNABLES, LD_PRELOAD)
	// and the machine (OS and architecture, CPU model and features,
	// transparent huge pages). The resident memory the budget starts from
	// is always measured anew. Empty (the default): calibrate at every
	// start.
	CacheDir string
	// CachedOnly takes the fit from CacheDir and measures nothing: with no
	// kept fit, CPU batches are bounded by rows and tokens only, and the
	// log says so. For a check that must answer quickly (`scorer doctor`:
	// measuring takes 11 s of a 24 s doctor on production-size DeBERTa-v3
	// in fp16 on 2 cores), not for a service.
	CachedOnly bool
}

// CPUMemory bounds CPU batches by memory; see CPUMemoryConfig. Without it
// (the default) CPU batches are bounded by MaxBatchRows and MaxBatchTokens
// alone.
func CPUMemory(c CPUMemoryConfig) Option {
	return optFunc(func(cf *cfg) { cf.cpuMem = &c })
}

// processMemory reads this process's resident memory. The pool calibrates
// the CPU engine with it; tests replace it.
type processMemory interface {
	// resetPeak starts a new high-water mark at the current resident size.
	resetPeak() error
	// usage returns resident bytes now and the high-water mark.
	usage() (rss, peak uint64, err error)
}

// cpuBudget is a CPU device's memory plan, fixed at start.
type cpuBudget struct {
	// room is the most modelled memory one batch may take.
	room float64
	// baseline is the resident memory once the engine was open and
	// calibrated, unread mapped weights included.
	baseline uint64
	// unread is the part of baseline mapped from data files and not yet
	// resident (mappedReader).
	unread uint64
}

// mappedReader is a processMemory that also reads the bytes this process
// has mapped from data files and not read yet (procSelf: /proc/self/smaps).
// A session maps its large weights and reads them only as runs touch them,
// so the resident size alone depends on what ran before it was read: a
// start that measured has read them, a start that took a kept fit (or a
// session from GRAPH_CACHE, whose prepacked weights are all mapped) has
// not, and a budget from its resident size alone gives each worker the
// weights' memory too (1.3 GB on the production stand-in: 0.13-0.16 GB
// resident at /readyz from the graph cache, 1.42 GB without it).
type mappedReader interface {
	mappedUnread() (uint64, error)
}

// defaultCPUShapes is one row at 32, 64, 128, 256 and 512 tokens and at
// twice refLen, capped at maxLen, shortest first.
func defaultCPUShapes(refLen, maxLen int) []Shape {
	var out []Shape
	for _, l := range []int{32, 64, 128, 256, 512, 2 * refLen} {
		out = append(out, Shape{Rows: 1, Len: min(l, maxLen)})
	}
	slices.SortFunc(out, func(a, b Shape) int { return a.Len - b.Len })
	return slices.Compact(out)
}

// slowShape is how long a calibration run may take for longer default
// shapes to follow it: longer rows add little to a fit that already spans
// 32 to 2·RefLen tokens, and at production size each costs seconds.
const slowShape = 250 * time.Millisecond

// repeatUnder is how fast a calibration run must be to be repeated: a
// small model's shapes cost a few hundred KB, near the noise of page-level
// readings, so the largest of three readings is kept; a larger model's
// shape costs megabytes and its first reading, which includes the new
// shape's memory-pattern planning, is already the largest (production-size
// DeBERTa: 4.6, 4.2, 4.2 MB at 32 tokens). Each repeat there costs 0.2 s.
const repeatUnder = 50 * time.Millisecond

// calibrateCPU learns the CPU engine's memory per batch (measureCPU), or
// takes what an earlier start learnt under the same key from
// CPUMemoryConfig.CacheDir, and sets the budget from it and the resident
// memory now. Without a usable fit the pool runs without a memory cap and
// says so.
func (p *Pool) calibrateCPU(ctx context.Context, eng Engine, mem processMemory, workers int) (MemoryModel, *cpuBudget, error) {
	c := p.cfg.cpuMem
	refLen := c.RefLen
	if refLen == 0 {
		refLen = 128
	}
	maxLen := p.cfg.calibration.MaxLen
	if n := engineMaxLength(eng); n > 0 {
		maxLen = min(maxLen, n)
	}
	refLen = min(refLen, maxLen)
	shapes := clampShapes(c.Shapes, maxLen)
	adaptive := len(shapes) == 0
	if adaptive {
		shapes = defaultCPUShapes(refLen, maxLen)
	}
	shapes = padShapes(eng, shapes)
	est := MemoryModel{}
	cache := p.cpuFitCache(eng, shapes, adaptive, refLen)
	fit, miss := loadFit[cpuFit](cache)
	switch {
	case miss == "":
		p.log.Info().Str("file", cache.path).Msg("gpupool: cpu: memory calibration taken from the cache: measured at an earlier start with the same model, ONNX Runtime, session options and machine")
	case c.CachedOnly:
		p.log.Info().Msg("gpupool: cpu: no kept memory calibration and CachedOnly: CPU batches are bounded by rows and tokens only")
		return est, nil, nil
	default:
		pts, err := p.measureCPU(ctx, eng, mem, shapes, adaptive, refLen, maxLen)
		if err != nil {
			return MemoryModel{}, nil, err
		}
		e, ok := fitMemory(pts)
		if !ok {
			p.log.Warn().Int("points", len(pts)).Msg("gpupool: cpu: memory calibration gave no usable fit; CPU batches are bounded by rows and tokens only")
			return est, nil, nil
		}
		fit = cpuFit{Base: max(0, e.Base), PerToken: e.PerToken, PerTokenLen: e.PerTokenLen}
		if err := storeFit(cache, fit, pts); err != nil {
			p.log.Info().Err(err).Msg("gpupool: cpu: the memory calibration is not kept for the next start")
		}
	}
	est.Base, est.PerToken, est.PerTokenLen, est.Calibrated = fit.Base, fit.PerToken, fit.PerTokenLen, true
	rss, _, err := mem.usage()
	if err != nil {
		return MemoryModel{}, nil, fmt.Errorf("gpupool: cpu: cannot measure memory: %w", err)
	}
	bud := &cpuBudget{baseline: rss}
	if m, ok := mem.(mappedReader); ok {
		if bud.unread, err = m.mappedUnread(); err != nil {
			p.log.Warn().Err(err).Msg("gpupool: cpu: cannot read the process's mappings; the memory budget counts resident weights only, and weights read later take from the batches' share")
		}
		bud.baseline += bud.unread
	}
	batchCap := float64(c.BatchBytes)
	if batchCap == 0 {
		batchCap = est.Bytes(p.cfg.maxBatchRows, refLen)
	}
	bud.room = batchCap
	share := math.Inf(1)
	if c.Limit > 0 {
		share = (float64(c.Limit) - float64(bud.baseline) - float64(c.Reserve)) / float64(max(workers, 1))
		bud.room = min(bud.room, share)
	}
	est.BudgetBytes, est.BaselineBytes = bud.room, bud.baseline
	if est.MaxRows(maxLen, bud.room) < 1 {
		ev := func(e *zerolog.Event) *zerolog.Event {
			e = e.Uint64("limit_bytes", c.Limit).Uint64("baseline_bytes", bud.baseline).Uint64("mapped_unread_bytes", bud.unread).Uint64("reserve_bytes", c.Reserve).
				Int("workers", workers).Float64("batch_cap_bytes", batchCap).Int("max_len", maxLen).
				Float64("one_pair_bytes", est.Bytes(1, maxLen))
			if c.Limit > 0 {
				e = e.Float64("share_per_worker_bytes", share)
			}
			return e
		}
		// Which bound leaves no room for the pair decides what is true:
		// the per-batch cap only makes such pairs run alone, which is
		// what it is for; a share of the limit that small means the
		// process may go over its limit.
		if est.MaxRows(maxLen, share) < 1 {
			ev(p.log.Warn()).Msg("gpupool: cpu: the memory budget leaves less per worker than one pair of the model's maximum length needs; such pairs still run, one per batch, above the budget: raise the memory limit or lower WORKERS")
		} else {
			ev(p.log.Info()).Msg("gpupool: cpu: one pair of the model's maximum length needs more than one batch may take (CPU_MAX_BATCH_BYTES; auto: CPU_MAX_BATCH_ROWS pairs of 128 tokens); such pairs run one per batch, above that cap, within each worker's share of the memory budget")
		}
	}
	return est, bud, nil
}

// measureCPU measures the CPU engine's memory per batch: after a warm-up
// run, each shape runs from an empty arena (every run empties it at its
// end) with the process's peak reset, and the peak's rise over the
// resident size before it is the shape's cost; a fast shape is measured
// three times and the largest reading kept (repeatUnder).
func (p *Pool) measureCPU(ctx context.Context, eng Engine, mem processMemory, shapes []Shape, adaptive bool, refLen, maxLen int) ([]memPoint, error) {
	id := p.cfg.calibration.TokenID
	// Every calibration run leaves the arena empty, so each shape is
	// measured from an empty arena rather than on top of the previous
	// shape's high-water mark: in the same run where the engine can
	// (arenaReleasingScorer, model.Session), else by ArenaReleaser's extra
	// run after it.
	rs, oneRun := eng.(arenaReleasingScorer)
	rel, canRelease := eng.(ArenaReleaser)
	cannot := func(err error) {
		p.log.Warn().Err(err).Msg("gpupool: cpu: cannot release the arena between calibration shapes; readings are high-water marks")
		oneRun, canRelease = false, false
	}
	score := func(s Shape) error {
		pairs := syntheticPairs(s, id)
		if oneRun {
			_, err := rs.ScorePairsReleasingArena(ctx, pairs)
			if !errors.Is(err, model.ErrNoArenaShrink) {
				return err
			}
			cannot(err)
		}
		_, err := eng.ScorePairs(ctx, pairs)
		return err
	}
	// empty follows every run, outside the measured window.
	empty := func() {
		if !oneRun && canRelease {
			if err := rel.ReleaseArena(ctx); err != nil {
				cannot(err)
			}
		}
	}
	if err := score(Shape{Rows: 1, Len: min(8, maxLen)}); err != nil {
		return nil, fmt.Errorf("gpupool: cpu: calibration warm-up: %w", err)
	}
	empty()
	var pts []memPoint
	var last time.Duration
	for _, s := range shapes {
		if adaptive && s.Len > 2*refLen && last > slowShape {
			break
		}
		var ys []float64
		for rep := 0; rep < 3; rep++ {
			if err := mem.resetPeak(); err != nil {
				return nil, fmt.Errorf("gpupool: cpu: cannot measure memory: %w", err)
			}
			before, _, err := mem.usage()
			if err != nil {
				return nil, fmt.Errorf("gpupool: cpu: cannot measure memory: %w", err)
			}
			t0 := time.Now()
			if err := score(s); err != nil {
				return nil, fmt.Errorf("gpupool: cpu: calibration batch %dx%d: %w", s.Rows, s.Len, err)
			}
			last = time.Since(t0)
			_, peak, err := mem.usage()
			if err != nil {
				return nil, fmt.Errorf("gpupool: cpu: cannot measure memory: %w", err)
			}
			empty()
			ys = append(ys, max(0, float64(peak)-float64(before)))
			if last > repeatUnder {
				break
			}
		}
		// The most a shape ever added: a reading falls short when the run
		// reuses heap pages still resident from an earlier one.
		pts = append(pts, memPoint{rows: s.Rows, length: s.Len, bytes: slices.Max(ys)})
		p.log.Debug().Int("rows", s.Rows).Int("len", s.Len).Floats64("bytes", ys).Dur("took", last).Msg("gpupool: cpu: calibration shape")
	}
	return pts, nil
}

// arenaReleasingScorer is an optional Engine extension CPU calibration uses:
// score a batch and empty the arena at the end of the same run
// (model.Session). ArenaReleaser empties it with a run of its own, which on
// a production-size model costs as much as a short calibration shape.
type arenaReleasingScorer interface {
	ScorePairsReleasingArena(ctx context.Context, pairs []model.Pair) ([]float32, error)
}

// errNoProcMemory is returned where the process's memory cannot be read.
var errNoProcMemory = errors.New("gpupool: process memory readings not available")
