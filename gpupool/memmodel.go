package gpupool

import (
	"math"
	"slices"
)

// MemoryModel is a device's memory as the pool plans and admits with it:
// what a batch costs (Bytes), how many rows of a length fit in some room
// (MaxRows), and the room one batch has within a budget (Room). The pool
// keeps one per device, calibrated at start (GPU always, CPU with
// CPUMemory); DeviceStats.Memory is a copy, so `scorer doctor` and
// gpu-proof report what the pool does instead of rebuilding it.
//
// A batch of rows × len padded tokens needs about Base + PerRow·rows +
// PerToken·rows·len + PerTokenLen·rows·len² bytes beyond the weights. The
// len² term is attention: every layer holds rows·heads·len² scores (and
// their softmax) at once, which for long pairs outgrows everything linear in
// the tokens. The per-row term is what a row costs whatever its length:
// DeBERTa-v3's relative-position Tile on the first GPU run (0.7 MiB fp16,
// 2.6 MiB fp32), without which short batches of many rows were
// under-predicted by 20-35%.
type MemoryModel struct {
	// Base, PerRow, PerToken and PerTokenLen are the fitted coefficients,
	// in bytes, before the margins Bytes adds; zero on a CPU without
	// CPUMemory, the configured fallback on a GPU that could not be
	// calibrated.
	Base, PerRow, PerToken, PerTokenLen float64
	// HeldOut is the GPU fit's largest under-prediction of a calibration
	// shape it was not fitted on (leave one out), relative: added to every
	// estimate on top of the 10% fragmentation margin, so shapes between
	// and beyond the calibration ladder are not under-predicted by the
	// fit's own error.
	HeldOut float64
	// Calibrated says the coefficients were measured (at this start, or at
	// an earlier one with the same key), not the fallback.
	Calibrated bool

	// WeightBytes is what opening a GPU's engine took (its weights, and
	// the CUDA context where readings are per process).
	WeightBytes uint64
	// BesideArenaBytes is what a GPU's admission counts beside the weights
	// and the arena: the CUDA context's growth on first use and each
	// concurrent run's cuBLAS/cuDNN workspace, measured once every worker
	// has run when BesideArenaMeasured, else the DefaultGPUMemMargin floor.
	BesideArenaBytes    float64
	BesideArenaMeasured bool
	// HeadroomBytes is the free memory a GPU's admission leaves beside a
	// batch (Headroom).
	HeadroomBytes float64
	// BudgetBytes is what the pool admits against. On a GPU: this
	// process's memory on the device, GPUMemLimit and never above
	// MemFraction of it. On a CPU with CPUMemory: the most one batch's
	// Bytes may be (BatchBytes, or one worker's share of the limit), with
	// nothing beside it to take off. Zero: no budget.
	BudgetBytes float64
	// BaselineBytes is a CPU's resident memory once its engine was open
	// and calibrated (CPUMemory only).
	BaselineBytes uint64

	// usedBase is device memory in use right after the engine opened,
	// before any batch ran (admission credits growth past it as our
	// arena); arena is the memory calibration left in ORT's arena (the
	// largest warm-up batch's footprint), reusable by later batches.
	usedBase uint64
	arena    float64
}

// fragmentationMargin is added to every estimate: a BFC arena serves a
// request from a free chunk at least as large, so a run can need more than
// its tensors' sum when the free space is split (kSameAsRequested growth
// keeps this small, not zero).
const fragmentationMargin = 0.10

// factor is what every estimate is multiplied by.
func (e MemoryModel) factor() float64 { return (1 + fragmentationMargin) * (1 + e.HeldOut) }

// Bytes is what a batch of rows pairs padded to length tokens needs beyond
// the weights and BesideArenaBytes, margins included: what admission
// reserves for it.
func (e MemoryModel) Bytes(rows, length int) float64 {
	r, l := float64(rows), float64(length)
	return max(0, e.Base+e.PerRow*r+e.PerToken*r*l+e.PerTokenLen*r*l*l) * e.factor()
}

// MaxRows is the most rows of length tokens whose Bytes fits in room bytes;
// 0 when not even one row does.
func (e MemoryModel) MaxRows(length int, room float64) int {
	l := float64(length)
	per := (e.PerRow + e.PerToken*l + e.PerTokenLen*l*l) * e.factor()
	avail := room - max(0, e.Base)*e.factor()
	if per <= 0 || avail <= 0 {
		return 0
	}
	// A room that is some batch's Bytes (the CPU's default cap is 16 rows
	// of 128 tokens) comes back a rounding error short of that batch:
	// without the tolerance 16 rows of 128 did not fit their own cap, nor
	// one row of 512 a fit with nothing linear in the tokens (16·128² =
	// 512²).
	return int(min(avail/per*(1+roundingTolerance), 1<<30))
}

// roundingTolerance is the relative error MaxRows forgives, far below any
// margin: 1e-9 of a GiB is a byte.
const roundingTolerance = 1e-9

// Room is what one batch may take on an otherwise idle device when budget
// bytes are this process's there: budget less WeightBytes,
// BesideArenaBytes and HeadroomBytes. Room(BudgetBytes) is what the planner
// cuts each batch's rows to (MaxRows); on a CPU it is BudgetBytes itself.
// Admission refuses for good a batch whose Bytes exceed it.
func (e MemoryModel) Room(budget float64) float64 {
	return budget - float64(e.WeightBytes) - e.BesideArenaBytes - e.HeadroomBytes
}

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
func fitActivations(pts []memPoint) (MemoryModel, bool) {
	est, ok := fitRelative(pts)
	if !ok {
		return MemoryModel{}, false
	}
	for i, pt := range pts {
		if pt.bytes <= 0 {
			continue
		}
		rest := append(slices.Clone(pts[:i]), pts[i+1:]...)
		if e, ok := fitRelative(rest); ok {
			under := (pt.bytes - e.Bytes(pt.rows, pt.length)/e.factor()) / pt.bytes
			est.HeldOut = min(maxHeldOut, max(est.HeldOut, under))
		}
	}
	return est, true
}

// fitRelative is fitActivations without the held-out margin.
func fitRelative(pts []memPoint) (MemoryModel, bool) {
	var top float64
	for _, pt := range pts {
		top = max(top, pt.bytes)
	}
	if top <= 0 {
		return MemoryModel{}, false
	}
	// A reading of nothing (noise around a tiny shape) would get an
	// infinite weight; a thousandth of the largest bounds it.
	floor := top / 1000
	weight := func(pt memPoint) float64 { return 1 / max(pt.bytes, floor) }
	var best MemoryModel
	bestErr := math.Inf(1)
	for mask := 1; mask < 8; mask++ {
		terms := []memTerm{termBase}
		for k := termPerRow; k <= termPerTokenLen; k++ {
			if mask&(1<<(k-1)) != 0 {
				terms = append(terms, k)
			}
		}
		e, ok := fitTerms(pts, terms, weight)
		if !ok || e.PerRow < 0 || e.PerToken < 0 || e.PerTokenLen < 0 {
			continue
		}
		e.Base = max(0, e.Base)
		if e.PerRow <= 0 && e.PerToken <= 0 && e.PerTokenLen <= 0 {
			continue
		}
		var sse float64
		for _, pt := range pts {
			d := (e.Bytes(pt.rows, pt.length)/e.factor() - pt.bytes) / max(pt.bytes, floor)
			sse += d * d
		}
		if sse < bestErr {
			best, bestErr = e, sse
		}
	}
	return best, !math.IsInf(bestErr, 1)
}

// memTerm is one term of the memory model, in the order of MemoryModel's
// coefficients: the per-batch intercept, then what grows with rows,
// rows·len and rows·len².
type memTerm int

const (
	termBase memTerm = iota
	termPerRow
	termPerToken
	termPerTokenLen
)

// value is the term's factor at a rows × length batch.
func (k memTerm) value(rows, length int) float64 {
	r, l := float64(rows), float64(length)
	return [...]float64{1, r, r * l, r * l * l}[k]
}

// fitTerms is the one least-squares fit of the memory model, for the GPU's
// calibration (fitActivations) and the CPU's (fitMemory) alike: the
// coefficients of terms that minimise Σ (weight·(model − bytes))² over
// pts, every other coefficient zero; weight nil weighs every point 1. ok
// is false with fewer points than terms or (nearly) dependent terms. The
// coefficients are as solved: which signs are usable is the caller's rule.
func fitTerms(pts []memPoint, terms []memTerm, weight func(memPoint) float64) (MemoryModel, bool) {
	if len(pts) < len(terms) {
		return MemoryModel{}, false
	}
	x := make([][]float64, len(pts))
	y := make([]float64, len(pts))
	for i, pt := range pts {
		w := 1.0
		if weight != nil {
			w = weight(pt)
		}
		x[i] = make([]float64, len(terms))
		for j, k := range terms {
			x[i][j] = k.value(pt.rows, pt.length) * w
		}
		y[i] = pt.bytes * w
	}
	coef, ok := leastSquares(x, y)
	if !ok {
		return MemoryModel{}, false
	}
	var e MemoryModel
	coefs := [...]*float64{&e.Base, &e.PerRow, &e.PerToken, &e.PerTokenLen}
	for j, k := range terms {
		*coefs[k] = coef[j]
	}
	return e, true
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

// fitMemory fits the CPU's bytes ≈ a + b·rows·len + c·rows·len²
// (fitTerms, unweighted). A negative c (no visible quadratic growth, or
// noise) falls back to the line a + b·rows·len, a negative b to
// a + c·rows·len²; ok is false when even the line has no positive slope.
// The intercept is as fitted, negative included.
func fitMemory(pts []memPoint) (MemoryModel, bool) {
	lens := map[int]bool{}
	for _, pt := range pts {
		lens[pt.length] = true
	}
	if len(lens) >= 3 {
		e, ok := fitTerms(pts, []memTerm{termBase, termPerToken, termPerTokenLen}, nil)
		if ok && e.PerTokenLen >= 0 && e.PerToken >= 0 && (e.PerToken > 0 || e.PerTokenLen > 0) {
			return e, true
		}
		if ok && e.PerTokenLen > 0 && e.PerToken < 0 {
			// Growth all in len² (a negative linear term is noise around
			// zero): a + c·rows·len², not a line that misses the curve.
			if e, ok := fitTerms(pts, []memTerm{termBase, termPerTokenLen}, nil); ok && e.PerTokenLen > 0 {
				return e, true
			}
		}
	}
	e, ok := fitTerms(pts, []memTerm{termBase, termPerToken}, nil)
	if !ok || e.PerToken <= 0 {
		return MemoryModel{}, false
	}
	return e, true
}
