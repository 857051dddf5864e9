package bench

import "strconv"

// target is a bound a figure is checked against, and the same bound as the
// tables print it: the check and its printed form are one value, so they
// cannot drift apart.
type target struct {
	op    string  // "≥", "≤" or "<"
	bound float64 // in the figure's own unit (a share, not a percentage)
	unit  string  // "" (a plain number), "%" (bound is a share, printed × 100) or "×"
	prec  int     // digits after the point as printed; -1: as few as show the bound
}

func atLeast(bound float64, unit string) target {
	return target{op: "≥", bound: bound, unit: unit, prec: -1}
}
func atMost(bound float64, unit string) target {
	return target{op: "≤", bound: bound, unit: unit, prec: -1}
}
func below(bound float64, unit string) target {
	return target{op: "<", bound: bound, unit: unit, prec: -1}
}

// digits is t printed with n digits after the point ("≥ 0.90").
func (t target) digits(n int) target { t.prec = n; return t }

// ok reports whether v meets t.
func (t target) ok(v float64) bool {
	switch t.op {
	case "≥":
		return v >= t.bound
	case "≤":
		return v <= t.bound
	default:
		return v < t.bound
	}
}

// String is t as the tables print it: "≥ 0.90", "< 5%", "≥ 2.5×".
func (t target) String() string {
	if t.unit == "%" {
		return t.op + " " + strconv.FormatFloat(100*t.bound, 'f', t.prec, 64) + "%"
	}
	return t.op + " " + strconv.FormatFloat(t.bound, 'f', t.prec, 64) + t.unit
}

// The targets of the sections' rows (docs/benchmarks.md, "What each row
// measures", says where each comes from).
var (
	pipelineRatioTarget  = atLeast(0.90, "").digits(2) // pipeline / raw ORT on the same batches
	paddingTarget        = atLeast(0.85, "")           // real / padded tokens
	tokenizerShareTarget = below(0.05, "%")            // of the pipeline's CPU time
	memoryGrowthTarget   = atMost(0.15, "%")           // peak RSS, largest vs smallest backlog
	revisionSavedTarget  = atLeast(0.60, "%")          // inference pairs the cache saves
	revisionSpeedTarget  = atLeast(2.5, "×")           // pairs/s, cache on / off
)
