package measure

import "math"

// Tally lines up two sides' scores of the same pairs (A and B: two
// models, two devices, two graphs): how far apart they are and whether
// they decide alike. A pair is decided a match when its score is above
// Threshold, as the scorer's THRESHOLD decides.
type Tally struct {
	Threshold float64
	// KeepDiffs keeps every |Δp| in Diffs, in the order added, for
	// quantiles (Quantile, after sorting them).
	KeepDiffs bool
	Diffs     []float64

	Pairs int
	// Agree counts the pairs decided alike; OnlyA and OnlyB those only one
	// side decides a match.
	Agree, OnlyA, OnlyB int
	MaxAbsDiff          float64
	SumAbsDiff          float64
}

// Add counts one pair scored a by A and b by B and reports whether their
// decisions differ (a flip).
func (t *Tally) Add(a, b float32) (flip bool) {
	d := math.Abs(float64(a) - float64(b))
	t.Pairs++
	t.MaxAbsDiff = math.Max(t.MaxAbsDiff, d)
	t.SumAbsDiff += d
	if t.KeepDiffs {
		t.Diffs = append(t.Diffs, d)
	}
	da, db := float64(a) > t.Threshold, float64(b) > t.Threshold
	switch {
	case da == db:
		t.Agree++
	case da:
		t.OnlyA++
	default:
		t.OnlyB++
	}
	return da != db
}

// AddAll adds a[i] against b[i] for every i of a (b at least as long).
func (t *Tally) AddAll(a, b []float32) {
	for i := range a {
		t.Add(a[i], b[i])
	}
}

// Agreement is the share of pairs decided alike; 1 when there are none
// (nothing disagrees).
func (t *Tally) Agreement() float64 {
	if t.Pairs == 0 {
		return 1
	}
	return float64(t.Agree) / float64(t.Pairs)
}

// Quantile is the nearest-rank q-quantile of sorted xs (xs not empty).
func Quantile(sorted []float64, q float64) float64 {
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}
