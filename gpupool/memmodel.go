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
