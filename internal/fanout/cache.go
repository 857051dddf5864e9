package fanout

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"strconv"

	"github.com/scorer/scorer/internal/fanout/scorecache"
	"github.com/scorer/scorer/model"
)

// cacheKeyBase hashes the part of a pair's cache key shared by every
// sentence of one label: the model's version (its ONNX SHA-256), how logits
// become a score (mode and both class indices), how the pair was encoded
// (pair or joined, and the separator) and the hypothesis text.
// Each field is length-prefixed so no two different keys hash the same
// bytes.
func cacheKeyBase(m *model.Model, hypothesis string) [sha256.Size]byte {
	h := sha256.New()
	field := func(s string) {
		var n [8]byte
		binary.LittleEndian.PutUint64(n[:], uint64(len(s)))
		h.Write(n[:])
		h.Write([]byte(s))
	}
	field("scorer score cache v1")
	field(m.SHA256)
	field(string(m.ScoreMode))
	field(strconv.Itoa(m.EntailmentIndex))
	field(strconv.Itoa(m.ContradictionIndex))
	field(string(m.PairEncoding))
	field(m.PairSeparator)
	field(hypothesis)
	var out [sha256.Size]byte
	h.Sum(out[:0])
	return out
}

// keyHasher builds cache keys; one per goroutine, reusing its buffer.
type keyHasher struct{ buf []byte }

// key is the 128-bit cache key of pair p under label base: SHA-256 over the
// base and the pair's token ids and token type ids exactly as the graph
// gets them (so after truncation), cut to its first 128 bits.
func (kh *keyHasher) key(base *[sha256.Size]byte, p model.Pair) scorecache.Key {
	b := append(kh.buf[:0], base[:]...)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(p.IDs)))
	for _, id := range p.IDs {
		b = binary.LittleEndian.AppendUint32(b, uint32(id))
	}
	for _, id := range p.TypeIDs {
		b = binary.LittleEndian.AppendUint32(b, uint32(id))
	}
	kh.buf = b
	sum := sha256.Sum256(b)
	return scorecache.Key{Hi: binary.LittleEndian.Uint64(sum[:8]), Lo: binary.LittleEndian.Uint64(sum[8:16])}
}

// scorePairs scores pairs through the cache when there is one: hits are
// filled in, each distinct missing key goes to the engine once (boilerplate
// such as "Thank you." repeats within a batch too), and the engine's scores
// are stored for next time. keys is nil when the cache is off.
func (ts *TranscriptScorer) scorePairs(ctx context.Context, pairs []model.Pair, keys []scorecache.Key) ([]float32, error) {
	if len(pairs) == 0 {
		return nil, nil
	}
	if keys == nil {
		return ts.infer(ctx, pairs)
	}
	scores := make([]float32, len(pairs))
	var missPairs []model.Pair
	var missKeys []scorecache.Key
	first := map[scorecache.Key]int{} // key → index in missPairs
	dup := map[int]int{}              // pair index → index in missPairs
	for i, k := range keys {
		if s, ok := ts.cache.Get(k); ok {
			scores[i] = s
			continue
		}
		j, seen := first[k]
		if !seen {
			j = len(missPairs)
			first[k] = j
			missPairs = append(missPairs, pairs[i])
			missKeys = append(missKeys, k)
		}
		dup[i] = j
	}
	if len(missPairs) == 0 {
		return scores, nil
	}
	got, err := ts.infer(ctx, missPairs)
	if err != nil {
		return nil, err
	}
	for j, k := range missKeys {
		ts.cache.Put(k, got[j])
	}
	for i, j := range dup {
		scores[i] = got[j]
	}
	return scores, nil
}
