package tokenizer

import (
	"encoding/json"
	"fmt"
	"hash/maphash"
	"strings"
	"sync"
	"sync/atomic"
	"unicode/utf8"
)

// bpe is HF's BPE model: a word starts as one symbol per character (byte
// fallback or unk for characters outside the vocabulary) and the pair with
// the lowest merge rank is merged until none is left. Byte-level exports
// (GPT-2, RoBERTa, BART, ModernBERT) feed it words the ByteLevel
// pre-tokenizer has mapped to printable characters, one per byte.
type bpe struct {
	vocab  map[string]int32
	size   int
	merges map[uint64]bpeMerge // (left id, right id) -> rank and merged id

	unk          string // "" = none
	fuseUnk      bool
	byteFallback bool
	ignoreMerges bool
	prefix       string // continuing_subword_prefix
	suffix       string // end_of_word_suffix
	byteIDs      bytePieces

	cache *bpeCache
}

type bpeMerge struct {
	rank, id int32
}

func mergeKey(a, b int32) uint64 { return uint64(uint32(a))<<32 | uint64(uint32(b)) }

// bpeMerges accepts both serialisations HF writes: "a b" strings (before
// tokenizers 0.20) and ["a", "b"] pairs (after, which allow spaces in tokens).
type bpeMerges [][2]string

func (m *bpeMerges) UnmarshalJSON(data []byte) error {
	var raw []json.RawMessage
	if err := json.Unmarshal(data, &raw); err != nil {
		return err
	}
	out := make(bpeMerges, 0, len(raw))
	rank := 0
	for _, r := range raw {
		if len(r) > 0 && r[0] == '"' {
			var line string
			if err := json.Unmarshal(r, &line); err != nil {
				return err
			}
			// HF's convert_merges_to_hashmap skips version headers and wants
			// exactly one space, counting ranks after the skip.
			if strings.HasPrefix(line, "#version") {
				continue
			}
			a, b, ok := strings.Cut(line, " ")
			if !ok || strings.Contains(b, " ") {
				return fmt.Errorf("merge %d (%q) is not two tokens separated by one space", rank+1, line)
			}
			out = append(out, [2]string{a, b})
		} else {
			var pair [2]string
			if err := json.Unmarshal(r, &pair); err != nil {
				return fmt.Errorf("merge %d: %w", rank+1, err)
			}
			out = append(out, pair)
		}
		rank++
	}
	*m = out
	return nil
}

// bpeCacheWords is how many distinct words the merge cache keeps. HF keeps
// 10,000; only speed depends on it, and a transcript corpus has more
// distinct words than that.
const (
	bpeCacheWords   = 100_000
	bpeCacheMaxWord = 256 // bytes; HF's MAX_LENGTH, longer words are not cached
)

func newBPE(raw json.RawMessage) (*bpe, error) {
	var c struct {
		Dropout      *float64         `json:"dropout"`
		Unk          *string          `json:"unk_token"`
		Prefix       *string          `json:"continuing_subword_prefix"`
		Suffix       *string          `json:"end_of_word_suffix"`
		FuseUnk      bool             `json:"fuse_unk"`
		ByteFallback bool             `json:"byte_fallback"`
		IgnoreMerges bool             `json:"ignore_merges"`
		Vocab        map[string]int32 `json:"vocab"`
		Merges       *bpeMerges       `json:"merges"`
	}
	if err := json.Unmarshal(raw, &c); err != nil {
		return nil, fmt.Errorf("tokenizer: bad BPE model: %w", err)
	}
	if c.Dropout != nil && *c.Dropout != 0 {
		// Dropout samples a different segmentation on every call; scores
		// must not depend on chance. 0 is HF's deterministic path too.
		return nil, fmt.Errorf("tokenizer: BPE dropout %v is not supported (scoring must be deterministic; set it to null)", *c.Dropout)
	}
	if len(c.Vocab) == 0 {
		return nil, fmt.Errorf("tokenizer: BPE model has an empty vocab")
	}
	if c.Merges == nil {
		return nil, fmt.Errorf("tokenizer: BPE model has no merges")
	}
	b := &bpe{
		vocab:        c.Vocab,
		merges:       make(map[uint64]bpeMerge, len(*c.Merges)),
		fuseUnk:      c.FuseUnk,
		byteFallback: c.ByteFallback,
		ignoreMerges: c.IgnoreMerges,
		cache:        newBPECache(),
	}
	for _, id := range c.Vocab {
		if id < 0 {
			return nil, fmt.Errorf("tokenizer: BPE vocab has negative id %d", id)
		}
		b.size = max(b.size, int(id)+1)
	}
	if c.Unk != nil {
		b.unk = *c.Unk
	}
	if c.Prefix != nil {
		b.prefix = *c.Prefix
	}
	if c.Suffix != nil {
		b.suffix = *c.Suffix
	}
	for i, m := range *c.Merges {
		a, ok := b.vocab[m[0]]
		if !ok {
			return nil, fmt.Errorf("tokenizer: BPE merge %d (%q %q): %q is not in the vocab", i, m[0], m[1], m[0])
		}
		bid, ok := b.vocab[m[1]]
		if !ok {
			return nil, fmt.Errorf("tokenizer: BPE merge %d (%q %q): %q is not in the vocab", i, m[0], m[1], m[1])
		}
		right := m[1]
		if b.prefix != "" {
			// The right part of a merge carries the prefix; the merged token
			// has it once, at its start (HF cuts prefix-length bytes).
			if len(right) < len(b.prefix) {
				return nil, fmt.Errorf("tokenizer: BPE merge %d (%q %q) is shorter than continuing_subword_prefix %q", i, m[0], m[1], b.prefix)
			}
			right = right[len(b.prefix):]
		}
		merged := m[0] + right
		id, ok := b.vocab[merged]
		if !ok {
			return nil, fmt.Errorf("tokenizer: BPE merge %d (%q %q): the merged token %q is not in the vocab", i, m[0], m[1], merged)
		}
		// A pair listed twice keeps its last rank, as HF's map does.
		b.merges[mergeKey(a, bid)] = bpeMerge{rank: int32(i), id: id}
	}
	b.byteIDs = newBytePieces(b.vocab)
	return b, nil
}

func (b *bpe) vocabSize() int { return b.size }

func (b *bpe) lookup(token string) (int32, bool) {
	id, ok := b.vocab[token]
	return id, ok
}

// bpeSymbol is one symbol of a word being merged, linked to its
// neighbours; a merged-away symbol has n == 0.
type bpeSymbol struct {
	id         int32
	prev, next int32
	n          int32 // bytes of the word it covers
}

// bpeCandidate is a pair that may be merged: the symbol at pos with its
// next, into id. The heap pops the lowest rank, then the leftmost pos.
type bpeCandidate struct {
	rank, pos, id int32
}

func (c bpeCandidate) less(o bpeCandidate) bool {
	return c.rank < o.rank || (c.rank == o.rank && c.pos < o.pos)
}

func (b *bpe) tokenize(word string, sc *scratch, out []int32) ([]int32, error) {
	if word == "" {
		return out, nil
	}
	if b.ignoreMerges {
		if id, ok := b.vocab[word]; ok {
			return append(out, id), nil
		}
	}
	if ids, ok := b.cache.get(word); ok {
		return append(out, ids...), nil
	}
	start := len(out)
	out, err := b.merge(word, sc, out)
	if err != nil {
		return out, err
	}
	if len(word) < bpeCacheMaxWord {
		b.cache.put(word, out[start:])
	}
	return out, nil
}

// merge is HF's BPE::merge_word followed by Word::merge_all.
func (b *bpe) merge(word string, sc *scratch, out []int32) ([]int32, error) {
	syms := sc.syms[:0]
	add := func(id int32, n int) {
		i := int32(len(syms))
		if i > 0 {
			syms[i-1].next = i
		}
		syms = append(syms, bpeSymbol{id: id, prev: i - 1, next: -1, n: int32(n)})
	}
	unkID, unkLen := int32(-1), 0
	for i := 0; i < len(word); {
		_, size := utf8.DecodeRuneInString(word[i:])
		piece := word[i : i+size]
		first, last := i == 0, i+size == len(word)
		key := piece
		if (!first && b.prefix != "") || (last && b.suffix != "") {
			buf := sc.buf[:0]
			if !first {
				buf = append(buf, b.prefix...)
			}
			buf = append(buf, piece...)
			if last {
				buf = append(buf, b.suffix...)
			}
			sc.buf = buf
			key = string(buf)
		}
		i += size
		if id, ok := b.vocab[key]; ok {
			if unkID >= 0 {
				add(unkID, unkLen)
				unkID = -1
			}
			add(id, size)
			continue
		}
		if b.byteFallback {
			if b.byteIDs.cover(key) {
				// HF adds the byte pieces without flushing a pending unk.
				for j := 0; j < len(key); j++ {
					add(b.byteIDs[key[j]], 1)
				}
				continue
			}
		}
		if b.unk == "" {
			// HF drops a character it can neither find nor call unknown.
			continue
		}
		id, ok := b.vocab[b.unk]
		if !ok {
			sc.syms = syms
			return out, fmt.Errorf("tokenizer: BPE unk_token %q is not in the vocab, and %q has no token for %q", b.unk, word, piece)
		}
		switch {
		case unkID >= 0 && b.fuseUnk:
			unkLen += size
		case unkID >= 0:
			add(unkID, unkLen)
			unkID, unkLen = id, size
		default:
			unkID, unkLen = id, size
		}
	}
	if unkID >= 0 {
		add(unkID, unkLen)
	}

	heap := sc.heap[:0]
	for i := 0; i+1 < len(syms); i++ {
		if m, ok := b.merges[mergeKey(syms[i].id, syms[i+1].id)]; ok {
			heap = heapPush(heap, bpeCandidate{rank: m.rank, pos: int32(i), id: m.id})
		}
	}
	for len(heap) > 0 {
		var top bpeCandidate
		top, heap = heapPop(heap)
		cur := &syms[top.pos]
		if cur.n == 0 || cur.next < 0 {
			continue
		}
		nextPos := cur.next
		right := syms[nextPos]
		// Skip candidates that an earlier merge made stale.
		if m, ok := b.merges[mergeKey(cur.id, right.id)]; !ok || m.id != top.id {
			continue
		}
		cur.id = top.id
		cur.n += right.n
		cur.next = right.next
		syms[nextPos].n = 0
		if right.next >= 0 {
			syms[right.next].prev = top.pos
		}
		if cur.prev >= 0 {
			if m, ok := b.merges[mergeKey(syms[cur.prev].id, cur.id)]; ok {
				heap = heapPush(heap, bpeCandidate{rank: m.rank, pos: cur.prev, id: m.id})
			}
		}
		if cur.next >= 0 {
			if m, ok := b.merges[mergeKey(cur.id, syms[cur.next].id)]; ok {
				heap = heapPush(heap, bpeCandidate{rank: m.rank, pos: top.pos, id: m.id})
			}
		}
	}
	for _, s := range syms {
		if s.n != 0 {
			out = append(out, s.id)
		}
	}
	sc.syms, sc.heap = syms, heap
	return out, nil
}

func heapPush(h []bpeCandidate, c bpeCandidate) []bpeCandidate {
	h = append(h, c)
	for i := len(h) - 1; i > 0; {
		p := (i - 1) / 2
		if !h[i].less(h[p]) {
			break
		}
		h[i], h[p] = h[p], h[i]
		i = p
	}
	return h
}

func heapPop(h []bpeCandidate) (bpeCandidate, []bpeCandidate) {
	top := h[0]
	n := len(h) - 1
	h[0] = h[n]
	h = h[:n]
	for i := 0; ; {
		l, r, m := 2*i+1, 2*i+2, i
		if l < n && h[l].less(h[m]) {
			m = l
		}
		if r < n && h[r].less(h[m]) {
			m = r
		}
		if m == i {
			break
		}
		h[i], h[m] = h[m], h[i]
		i = m
	}
	return top, h
}

// bpeCache maps words to their merged ids. The Tokenizer is shared by
// every scoring goroutine, so it is sharded under read-write locks; like
// HF's cache it stops taking words when full rather than evicting.
type bpeCache struct {
	seed   maphash.Seed
	n      atomic.Int64
	shards [64]struct {
		mu sync.RWMutex
		m  map[string][]int32
	}
}

func newBPECache() *bpeCache {
	c := &bpeCache{seed: maphash.MakeSeed()}
	for i := range c.shards {
		c.shards[i].m = map[string][]int32{}
	}
	return c
}

func (c *bpeCache) shard(word string) int { return int(maphash.String(c.seed, word) % 64) }

func (c *bpeCache) get(word string) ([]int32, bool) {
	s := &c.shards[c.shard(word)]
	s.mu.RLock()
	ids, ok := s.m[word]
	s.mu.RUnlock()
	return ids, ok
}

func (c *bpeCache) put(word string, ids []int32) {
	if c.n.Load() >= bpeCacheWords {
		return
	}
	s := &c.shards[c.shard(word)]
	s.mu.Lock()
	if _, ok := s.m[word]; !ok {
		s.m[strings.Clone(word)] = append([]int32(nil), ids...)
		c.n.Add(1)
	}
	s.mu.Unlock()
}
