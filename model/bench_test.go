package model

import (
	"fmt"
	"path/filepath"
	"testing"

	"github.com/scorer/scorer/internal/testenv"
)

// syntheticPairs builds rows pairs of exactly length tokens with ids in
// every model's vocabulary, so a shape's cost is measured without tokenizer
// variance.
func syntheticPairs(rows, length int) []Pair {
	pairs := make([]Pair, rows)
	for r := range pairs {
		ids := make([]int32, length)
		types := make([]int32, length)
		for j := range ids {
			ids[j] = int32(100 + (r*131+j*17)%5000)
			if j >= length/2 {
				types[j] = 1
			}
		}
		pairs[r] = Pair{IDs: ids, TypeIDs: types}
	}
	return pairs
}

// BenchmarkScorePairs reports pairs/s for batch shapes rows×len on the
// default CPU session.
func BenchmarkScorePairs(b *testing.B) {
	shapes := []struct{ rows, length int }{{1, 32}, {16, 32}, {64, 48}, {32, 128}}
	for _, dir := range testenv.ModelDirs(b) {
		m := loadModel(b, LoadOptions{Dir: dir})
		s := newSession(b, m)
		for _, sh := range shapes {
			b.Run(fmt.Sprintf("%s/%dx%d", filepath.Base(dir), sh.rows, sh.length), func(b *testing.B) {
				pairs := syntheticPairs(sh.rows, sh.length)
				for b.Loop() {
					if _, err := s.ScorePairs(b.Context(), pairs); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(sh.rows*b.N)/b.Elapsed().Seconds(), "pairs/s")
			})
		}
	}
}
