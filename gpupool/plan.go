package gpupool

import (
	"slices"

	"github.com/scorer/scorer/model"
)

// planBatches sorts the pairs by length and cuts the sorted run into
// batches whose padded size (rows × longest length) stays within maxTokens
// and whose rows stay within maxRows. Sorting puts pairs of similar length
// together; the cut points are then chosen by dynamic programming to
// minimise padded tokens plus overhead tokens per batch, so a batch is not
// stretched over very different lengths just because the budget allows it,
// nor cut into slivers that waste per-run overhead. A pair longer than
// maxTokens on its own becomes a batch of one: it cannot be made smaller and
// must still be scored. rowCap, when not nil, further caps the rows of a
// batch whose longest pair has the given length (the GPU memory model's
// answer); it must not grow with length. Each batch lists indices into
// pairs, shortest first; the batches come longest first, so that a call's
// last batches, those that leave workers idle once nothing else is queued,
// are its cheapest (the longest-processing-time-first rule). On the
// production-size model's typical input, the longest batch last kept one of
// two CPU workers idle for about 3 s; first, the tail is under 1 s. pad,
// when not nil, is the length a batch whose longest pair has the given
// length runs at (PAD_TO_MULTIPLE_OF, LengthPadder): the budget, the row
// cap and the cost all count padded tokens, since those are what a batch
// allocates and computes.
func planBatches(pairs []model.Pair, maxTokens, maxRows, overhead int, rowCap, pad func(length int) int) [][]int {
	n := len(pairs)
	if n == 0 {
		return nil
	}
	order := make([]int, n)
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return pairs[a].Len() - pairs[b].Len() })
	length := func(k int) int {
		l := max(pairs[order[k]].Len(), 1)
		if pad != nil {
			l = max(pad(l), l)
		}
		return l
	}

	// cost[j] is the cheapest plan for the first j sorted pairs; cut[j] is
	// where its last batch starts. The last batch [i, j) is padded to the
	// length of its longest, last pair (rounded up by pad).
	cost := make([]int, n+1)
	cut := make([]int, n+1)
	for j := 1; j <= n; j++ {
		l := length(j - 1)
		limit := maxRows
		if rowCap != nil {
			limit = max(1, min(limit, rowCap(l)))
		}
		cost[j] = -1
		for i := j - 1; i >= 0 && j-i <= limit; i-- {
			rows := j - i
			if rows > 1 && rows*l > maxTokens {
				break
			}
			c := cost[i] + rows*l + overhead
			if cost[j] < 0 || c < cost[j] {
				cost[j], cut[j] = c, i
			}
		}
	}
	var out [][]int
	for j := n; j > 0; j = cut[j] {
		out = append(out, order[cut[j]:j]) // longest first
	}
	return out
}

// shape returns a batch's rows, padded length and real token count.
func shape(pairs []model.Pair, idx []int) (rows, maxLen, real int) {
	for _, i := range idx {
		l := pairs[i].Len()
		real += l
		maxLen = max(maxLen, l)
	}
	return len(idx), maxLen, real
}

// LengthPadder is an optional Engine extension: PadLength is the length a
// batch whose longest pair has n tokens runs at (model.Session rounds it up
// to SessionOptions.PadToMultipleOf). The pool plans, admits and calibrates
// at that length: a memory model fitted on unpadded lengths would count
// 33 tokens for a batch that allocates 40.
type LengthPadder interface {
	PadLength(n int) int
}

// padLen is the length eng runs a batch of longest pair n at.
func padLen(eng Engine, n int) int {
	if p, ok := eng.(LengthPadder); ok {
		return max(p.PadLength(n), n)
	}
	return n
}

// padShapes is shapes at the lengths eng runs them at, in the same order,
// repeats left out: two shapes that pad to one are one measurement.
func padShapes(eng Engine, shapes []Shape) []Shape {
	out := make([]Shape, 0, len(shapes))
	for _, s := range shapes {
		s.Len = padLen(eng, s.Len)
		if !slices.Contains(out, s) {
			out = append(out, s)
		}
	}
	return out
}

// padFunc is what planBatches pads lengths with: the longest any usable
// device would run them at, so a batch planned within the token budget is
// within it on whichever device takes it; nil when no engine pads.
func (p *Pool) padFunc() func(int) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	var engs []Engine
	for _, d := range p.devices {
		if _, ok := d.engine.(LengthPadder); ok && !d.degraded {
			engs = append(engs, d.engine)
		}
	}
	if len(engs) == 0 {
		return nil
	}
	return func(n int) int {
		l := n
		for _, e := range engs {
			l = max(l, padLen(e, n))
		}
		return l
	}
}
