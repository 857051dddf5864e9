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
// two CPU workers idle for about 3 s; first, the tail is under 1 s.
func planBatches(pairs []model.Pair, maxTokens, maxRows, overhead int, rowCap func(length int) int) [][]int {
	n := len(pairs)
	if n == 0 {
		return nil
	}
	order := make([]int, n)
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return pairs[a].Len() - pairs[b].Len() })
	length := func(k int) int { return max(pairs[order[k]].Len(), 1) }

	// cost[j] is the cheapest plan for the first j sorted pairs; cut[j] is
	// where its last batch starts. The last batch [i, j) is padded to the
	// length of its longest, last pair.
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
