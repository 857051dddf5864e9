// Package scorecache is a bounded in-process cache of pair scores: a
// sentence × hypothesis pair already scored by this model is answered from
// memory instead of inference. A call is published several times
// (preliminary, corrected, final) and boilerplate sentences repeat across
// calls, so most pairs of a revision have been scored before.
//
// The cache never sees text or models: callers hash the whole key (model
// version, score mode, class indices, hypothesis, the premise's token ids
// after truncation) into a 128-bit Key, so two different pairs share an
// entry only on a 128-bit hash collision (about 2⁻¹²⁸ per pair of entries).
//
// Memory is accounted exactly: the table is a flat slice of 24-byte slots,
// grown by doubling up to the byte cap, and Bytes reports the slots
// allocated. Each key may live in either of two 8-slot buckets; below the
// cap a full pair of buckets makes the table double instead of evicting,
// and at the cap an insert replaces the least recently used entry of the
// key's 16 candidate slots (a set-associative LRU, as CPU caches do), so
// the footprint stays flat however long the process runs. While a shard
// grows, its old table (at most 1/32 of the cap) lives beside the new one
// until the move is done.
package scorecache

import (
	"cmp"
	"fmt"
	"math/bits"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// Key is a 128-bit hash of everything that decides a pair's score.
type Key struct{ Hi, Lo uint64 }

const (
	// SlotBytes is the memory of one entry: the key, the score and its
	// last-use tick. The table holds nothing else per entry.
	SlotBytes = 24
	// ways is the number of slots in a bucket; an insert into a full bucket
	// evicts the least recently used of them.
	ways = 8
	// shards split the table so concurrent scoring calls rarely wait on
	// one another's lock.
	shards = 16
	// minBuckets is a shard's first table: 64 buckets × 8 slots × 24 bytes
	// = 12 KiB, so a small or idle cache costs almost nothing.
	minBuckets = 64
	// MinBytes is the smallest cache New accepts: one full bucket per
	// shard.
	MinBytes = shards * ways * SlotBytes
)

// slot is one entry. tick 0 marks an empty slot.
type slot struct {
	key   Key
	score float32
	tick  uint32
}

// shard is one lock's worth of the table.
type shard struct {
	mu         sync.Mutex
	slots      []slot // len = buckets × ways
	buckets    int
	maxBuckets int
	used       int    // occupied slots
	tick       uint32 // last tick handed out
}

// Cache maps pair keys to scores within a byte budget. It is safe for
// concurrent use.
type Cache struct {
	shards [shards]shard
	bytes  atomic.Int64 // slots allocated × SlotBytes
	m      *metrics
}

// Stats are the cache's counters since New.
type Stats struct {
	Hits, Misses, Evictions, Entries, Bytes int64
}

// New returns a cache of at most maxBytes of table; reg (nil for none)
// receives its metrics. maxBytes must be at least MinBytes; a caller with
// the cache off should not build one.
func New(maxBytes int64, reg prometheus.Registerer) (*Cache, error) {
	perShard := maxBytes / shards / (ways * SlotBytes)
	if perShard < 1 {
		return nil, fmt.Errorf("scorecache: %d bytes is below the smallest cache, %d bytes", maxBytes, MinBytes)
	}
	m, err := newMetrics(reg)
	if err != nil {
		return nil, err
	}
	c := &Cache{m: m}
	for i := range c.shards {
		s := &c.shards[i]
		s.maxBuckets = int(min(perShard, int64(1)<<40))
		s.resize(min(minBuckets, s.maxBuckets))
	}
	c.bytes.Store(c.allocated())
	c.m.bytes.Set(float64(c.bytes.Load()))
	return c, nil
}

func (c *Cache) allocated() int64 {
	var n int64
	for i := range c.shards {
		n += int64(len(c.shards[i].slots)) * SlotBytes
	}
	return n
}

// shardOf picks a shard from bits the bucket index does not use much.
func (c *Cache) shardOf(k Key) *shard { return &c.shards[k.Hi>>60] }

// buckets returns k's two candidate buckets' first slots. Each maps a
// different half of the key onto [0, n) without a power-of-two size (the
// high half of x × n is uniform). Two choices per key let a full bucket
// spill into its alternative, so buckets overflow only near the cap.
func buckets(k Key, n int) (b1, b2 int) {
	h1, _ := bits.Mul64(k.Lo, uint64(n))
	// Hi's top bits pick the shard; mixing spreads the rest over n.
	h2, _ := bits.Mul64(k.Hi*0x9E3779B97F4A7C15, uint64(n))
	return int(h1) * ways, int(h2) * ways
}

// find returns the slot holding k, or -1.
func (s *shard) find(k Key) int {
	b1, b2 := buckets(k, s.buckets)
	for _, b := range [2]int{b1, b2} {
		for i := b; i < b+ways; i++ {
			if sl := &s.slots[i]; sl.tick != 0 && sl.key == k {
				return i
			}
		}
	}
	return -1
}

// Get returns the cached score of k and marks it recently used.
func (c *Cache) Get(k Key) (float32, bool) {
	s := c.shardOf(k)
	s.mu.Lock()
	if i := s.find(k); i >= 0 {
		sl := &s.slots[i]
		sl.tick = s.nextTick()
		score := sl.score
		s.mu.Unlock()
		c.m.hits.Inc()
		return score, true
	}
	s.mu.Unlock()
	c.m.misses.Inc()
	return 0, false
}

// Put stores score under k, replacing any older score of k.
func (c *Cache) Put(k Key, score float32) {
	s := c.shardOf(k)
	s.mu.Lock()
	evicted, grown := s.put(k, score)
	s.mu.Unlock()
	if grown != 0 {
		c.m.bytes.Set(float64(c.bytes.Add(grown)))
	}
	if evicted > 0 {
		c.m.evictions.Add(float64(evicted))
	}
}

// put inserts under the shard lock; it returns the entries evicted and the
// bytes the table grew by.
func (s *shard) put(k Key, score float32) (evicted int, grown int64) {
	// Below the cap nothing is evicted: the table doubles when it is 3/4
	// full or when k's bucket is full, whichever comes first (at 3/4 load
	// one 8-way bucket in seven would already be full).
	if s.buckets < s.maxBuckets && ((s.used+1)*4 > len(s.slots)*3 || s.bucketFull(k)) {
		before := len(s.slots)
		evicted = s.resize(min(2*s.buckets, s.maxBuckets))
		grown = int64(len(s.slots)-before) * SlotBytes
	}
	if s.insert(k, score, s.nextTick()) {
		evicted++
	}
	return evicted, grown
}

// bucketFull reports whether both of k's buckets are full and neither
// holds k.
func (s *shard) bucketFull(k Key) bool {
	if s.find(k) >= 0 {
		return false
	}
	b1, b2 := buckets(k, s.buckets)
	for _, b := range [2]int{b1, b2} {
		for i := b; i < b+ways; i++ {
			if s.slots[i].tick == 0 {
				return false
			}
		}
	}
	return true
}

// insert places k in one of its buckets: over its old entry, in a free
// slot, or over the least recently used entry of the two buckets
// (reported as an eviction).
func (s *shard) insert(k Key, score float32, tick uint32) (evicted bool) {
	if i := s.find(k); i >= 0 {
		s.slots[i].score, s.slots[i].tick = score, tick
		return false
	}
	// The emptier of the two buckets takes k (the "power of two choices",
	// which keeps the fullest bucket far below a single hash's).
	b1, b2 := buckets(k, s.buckets)
	free := [2]int{-1, -1}
	nfree := [2]int{}
	victim := -1
	for j, b := range [2]int{b1, b2} {
		for i := b; i < b+ways; i++ {
			if t := s.slots[i].tick; t == 0 {
				nfree[j]++
				free[j] = i
			} else if victim < 0 || t < s.slots[victim].tick {
				victim = i
			}
		}
	}
	if nfree[0] > 0 || nfree[1] > 0 {
		i := free[0]
		if nfree[1] > nfree[0] {
			i = free[1]
		}
		s.used++
		s.slots[i] = slot{key: k, score: score, tick: tick}
		return false
	}
	s.slots[victim] = slot{key: k, score: score, tick: tick}
	return true
}

// resize moves every entry into a table of n buckets, oldest first so that
// a bucket that overflows keeps its most recent entries. Below the cap an
// overflow doubles n again instead, so growth never drops an entry.
func (s *shard) resize(n int) (evicted int) {
	old := s.slots
	live := make([]slot, 0, len(old))
	for _, sl := range old {
		if sl.tick != 0 {
			live = append(live, sl)
		}
	}
	sortByTick(live)
	for {
		s.slots = make([]slot, n*ways)
		s.buckets = n
		s.used = 0
		evicted = 0
		for _, sl := range live {
			if s.insert(sl.key, sl.score, sl.tick) {
				evicted++
			}
		}
		if evicted == 0 || n >= s.maxBuckets {
			return evicted
		}
		n = min(2*n, s.maxBuckets)
	}
}

// nextTick is the shard's use clock. When it would wrap, every entry's
// tick is renumbered in the same order, so LRU order survives.
func (s *shard) nextTick() uint32 {
	if s.tick == ^uint32(0) {
		live := make([]*slot, 0, s.used)
		for i := range s.slots {
			if s.slots[i].tick != 0 {
				live = append(live, &s.slots[i])
			}
		}
		sortPtrByTick(live)
		for i, sl := range live {
			sl.tick = uint32(i + 1)
		}
		s.tick = uint32(len(live))
	}
	s.tick++
	return s.tick
}

// Stats returns the counters and the current size.
func (c *Cache) Stats() Stats {
	st := Stats{Hits: int64(counterValue(c.m.hits)), Misses: int64(counterValue(c.m.misses)),
		Evictions: int64(counterValue(c.m.evictions)), Bytes: c.bytes.Load()}
	for i := range c.shards {
		s := &c.shards[i]
		s.mu.Lock()
		st.Entries += int64(s.used)
		s.mu.Unlock()
	}
	return st
}

// MaxEntries is how many entries the cache holds at its byte cap.
func (c *Cache) MaxEntries() int64 {
	var n int64
	for i := range c.shards {
		n += int64(c.shards[i].maxBuckets) * ways
	}
	return n
}

func sortByTick(s []slot) {
	slices.SortFunc(s, func(a, b slot) int { return cmp.Compare(a.tick, b.tick) })
}

func sortPtrByTick(s []*slot) {
	slices.SortFunc(s, func(a, b *slot) int { return cmp.Compare(a.tick, b.tick) })
}
