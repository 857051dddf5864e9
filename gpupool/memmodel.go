package gpupool

import (
	"math"
	"slices"
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
	weight := func(pt memPoint) float64 { return 1 / max(pt.bytes, floor) }
	var best memEstimate
	bestErr := math.Inf(1)
	for mask := 1; mask < 8; mask++ {
		terms := []memTerm{termBase}
		for k := termPerRow; k <= termPerTokenLen; k++ {
			if mask&(1<<(k-1)) != 0 {
				terms = append(terms, k)
			}
		}
		e, ok := fitTerms(pts, terms, weight)
		if !ok || e.perRow < 0 || e.perToken < 0 || e.perTokenLen < 0 {
			continue
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

// memTerm is one term of the memory model, in the order of memEstimate's
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
func fitTerms(pts []memPoint, terms []memTerm, weight func(memPoint) float64) (memEstimate, bool) {
	if len(pts) < len(terms) {
		return memEstimate{}, false
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
		return memEstimate{}, false
	}
	var e memEstimate
	coefs := [...]*float64{&e.base, &e.perRow, &e.perToken, &e.perTokenLen}
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
func fitMemory(pts []memPoint) (memEstimate, bool) {
	lens := map[int]bool{}
	for _, pt := range pts {
		lens[pt.length] = true
	}
	if len(lens) >= 3 {
		e, ok := fitTerms(pts, []memTerm{termBase, termPerToken, termPerTokenLen}, nil)
		if ok && e.perTokenLen >= 0 && e.perToken >= 0 && (e.perToken > 0 || e.perTokenLen > 0) {
			return e, true
		}
		if ok && e.perTokenLen > 0 && e.perToken < 0 {
			// Growth all in len² (a negative linear term is noise around
			// zero): a + c·rows·len², not a line that misses the curve.
			if e, ok := fitTerms(pts, []memTerm{termBase, termPerTokenLen}, nil); ok && e.perTokenLen > 0 {
				return e, true
			}
		}
	}
	e, ok := fitTerms(pts, []memTerm{termBase, termPerToken}, nil)
	if !ok || e.perToken <= 0 {
		return memEstimate{}, false
	}
	return e, true
}
