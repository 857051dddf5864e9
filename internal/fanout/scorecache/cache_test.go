package scorecache

import (
	"math/rand/v2"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

func randKey(r *rand.Rand) Key { return Key{Hi: r.Uint64(), Lo: r.Uint64()} }

func TestGetPut(t *testing.T) {
	c, err := New(1<<20, nil)
	if err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(1, 2))
	keys := make([]Key, 1000)
	for i := range keys {
		keys[i] = randKey(r)
		if _, ok := c.Get(keys[i]); ok {
			t.Fatalf("key %d found before Put", i)
		}
		c.Put(keys[i], float32(i)/1000)
	}
	for i, k := range keys {
		if s, ok := c.Get(k); !ok || s != float32(i)/1000 {
			t.Fatalf("key %d: %v, %v; want %v", i, s, ok, float32(i)/1000)
		}
	}
	c.Put(keys[0], 0.5) // a new score replaces the old one
	if s, _ := c.Get(keys[0]); s != 0.5 {
		t.Errorf("after replace: %v", s)
	}
	// Keys that differ in one half only are different keys.
	if _, ok := c.Get(Key{Hi: keys[1].Hi, Lo: keys[1].Lo ^ 1}); ok {
		t.Error("a key differing in Lo was found")
	}
	if _, ok := c.Get(Key{Hi: keys[1].Hi ^ 1, Lo: keys[1].Lo}); ok {
		t.Error("a key differing in Hi was found")
	}
	st := c.Stats()
	if st.Hits != 1001 || st.Misses != 1002 || st.Entries != 1000 || st.Evictions != 0 {
		t.Errorf("stats %+v; want 1001 hits, 1002 misses, 1000 entries, 0 evictions", st)
	}
}

// TestNoEvictionBelowCap fills a cache to half its capacity: the table
// grows instead of evicting, so every entry is still there.
func TestNoEvictionBelowCap(t *testing.T) {
	c, err := New(4<<20, nil)
	if err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(11, 12))
	keys := make([]Key, c.MaxEntries()/2)
	for i := range keys {
		keys[i] = randKey(r)
		c.Put(keys[i], float32(i))
	}
	if st := c.Stats(); st.Evictions != 0 || st.Entries != int64(len(keys)) {
		t.Fatalf("half full: %+v; want %d entries, no evictions", st, len(keys))
	}
	for i, k := range keys {
		if s, ok := c.Get(k); !ok || s != float32(i) {
			t.Fatalf("key %d lost below the cap", i)
		}
	}
}

func TestNewErrors(t *testing.T) {
	for _, n := range []int64{-1, 0, shards*ways*SlotBytes - 1} {
		if _, err := New(n, nil); err == nil {
			t.Errorf("New(%d) succeeded", n)
		}
	}
	if _, err := New(shards*ways*SlotBytes, nil); err != nil {
		t.Errorf("smallest cache: %v", err)
	}
}

// TestBoundedAndEvicting fills a cache many times over its capacity: its
// table never passes the cap, it evicts, and it still holds the most
// recent entries (LRU within each bucket).
func TestBoundedAndEvicting(t *testing.T) {
	const capBytes = 256 << 10
	reg := prometheus.NewRegistry()
	c, err := New(capBytes, reg)
	if err != nil {
		t.Fatal(err)
	}
	max := c.MaxEntries()
	if max*SlotBytes > capBytes || max*SlotBytes < capBytes*9/10 {
		t.Fatalf("MaxEntries %d × %d bytes is not just under the cap %d", max, SlotBytes, capBytes)
	}
	r := rand.New(rand.NewPCG(3, 4))
	n := int(10 * max)
	keys := make([]Key, n)
	for i := range keys {
		keys[i] = randKey(r)
		c.Put(keys[i], float32(i))
		if b := c.Stats().Bytes; b > capBytes {
			t.Fatalf("after %d puts the table is %d bytes, over the cap %d", i+1, b, capBytes)
		}
	}
	st := c.Stats()
	if st.Entries > max || st.Entries < max*9/10 {
		t.Errorf("entries %d; want close to the capacity %d", st.Entries, max)
	}
	if want := int64(n) - st.Entries; st.Evictions != want {
		t.Errorf("evictions %d; want puts − entries = %d", st.Evictions, want)
	}
	// The newest half-capacity of keys are nearly all present, the oldest
	// are all gone.
	recent, old := 0, 0
	for i := n - int(max/2); i < n; i++ {
		if s, ok := c.Get(keys[i]); ok {
			if s != float32(i) {
				t.Fatalf("key %d holds %v", i, s)
			}
			recent++
		}
	}
	for i := range int(max / 2) {
		if _, ok := c.Get(keys[i]); ok {
			old++
		}
	}
	if recent < int(max/2)*95/100 || old != 0 {
		t.Errorf("%d of the %d newest keys kept, %d of the oldest; want ≥95%% and 0", recent, max/2, old)
	}
	st = c.Stats()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		m := mf.GetMetric()[0]
		got[mf.GetName()] = m.GetCounter().GetValue() + m.GetGauge().GetValue()
	}
	want := map[string]float64{"scorer_score_cache_hits_total": float64(st.Hits), "scorer_score_cache_misses_total": float64(st.Misses),
		"scorer_score_cache_evictions_total": float64(st.Evictions), "scorer_score_cache_bytes": float64(st.Bytes)}
	for name, v := range want {
		if got[name] != v {
			t.Errorf("%s = %v, want %v", name, got[name], v)
		}
	}
}

// TestRecentlyUsedSurvives touches one entry between floods of new keys: a
// hit refreshes it, so it outlives entries put after it.
func TestRecentlyUsedSurvives(t *testing.T) {
	c, err := New(shards*ways*SlotBytes, nil) // one bucket per shard
	if err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(5, 6))
	hot := Key{Hi: 0, Lo: 1} // shard 0
	c.Put(hot, 0.25)
	for range 100 {
		for range ways - 1 {
			c.Put(Key{Hi: r.Uint64() >> 4, Lo: r.Uint64()}, 1) // shard 0 too
		}
		if s, ok := c.Get(hot); !ok || s != 0.25 {
			t.Fatalf("the entry in use was evicted: %v, %v", s, ok)
		}
	}
	if st := c.Stats(); st.Evictions == 0 {
		t.Error("no evictions in a full bucket")
	}
}

// TestTickWrap runs a shard's use clock past its end: LRU order survives
// the renumbering.
func TestTickWrap(t *testing.T) {
	c, err := New(shards*ways*SlotBytes, nil)
	if err != nil {
		t.Fatal(err)
	}
	s := &c.shards[0]
	s.tick = ^uint32(0) - 3
	keys := make([]Key, ways)
	for i := range keys {
		keys[i] = Key{Hi: uint64(i), Lo: uint64(i)}
		c.Put(keys[i], float32(i))
	}
	if s.tick > 100 {
		t.Fatalf("tick %d after the wrap", s.tick)
	}
	c.Get(keys[0]) // keys[1] is now the least recently used
	c.Put(Key{Hi: 99, Lo: 99}, 9)
	if _, ok := c.Get(keys[1]); ok {
		t.Error("the least recently used key survived")
	}
	for _, i := range []int{0, 2, ways - 1} {
		if _, ok := c.Get(keys[i]); !ok {
			t.Errorf("key %d was evicted", i)
		}
	}
}

// TestBytesAreHonest checks Bytes against the Go heap: a full cache costs
// what it reports, give or take a little.
func TestBytesAreHonest(t *testing.T) {
	if testing.Short() {
		t.Skip("allocates 8 MiB")
	}
	// Big enough that the heap's own noise is far inside 5%; the check is a ratio, so
	// a larger cap (it was 32 MiB: 20 s under -race) proves nothing more.
	const capBytes = 8 << 20
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	c, err := New(capBytes, nil)
	if err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(7, 8))
	for range 2 * c.MaxEntries() {
		c.Put(randKey(r), 1)
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	heap := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	st := c.Stats()
	if st.Bytes > capBytes || heap > capBytes*105/100 || heap < st.Bytes*95/100 {
		t.Errorf("cap %d, reported %d, heap grew %d: want reported ≤ cap and heap within 5%%", capBytes, st.Bytes, heap)
	}
	t.Logf("cap %d, reported %d, heap grew %d", capBytes, st.Bytes, heap)
	runtime.KeepAlive(c)
}

func TestConcurrent(t *testing.T) {
	c, err := New(64<<10, nil)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(g), 9))
			for i := range 20000 {
				// Every other key comes from a hot set far smaller than the
				// cache, so hits are certain; the rest, from 25M keys, evict.
				k := Key{Hi: uint64(r.IntN(5000)), Lo: uint64(i % 5000)}
				if i%2 == 0 {
					k = Key{Hi: uint64(r.IntN(16)), Lo: uint64(r.IntN(16))}
				}
				k.Hi |= k.Hi << 60
				if s, ok := c.Get(k); ok && s != float32(k.Lo) {
					t.Errorf("key %v holds %v", k, s)
					return
				}
				c.Put(k, float32(k.Lo))
			}
		}()
	}
	wg.Wait()
	if st := c.Stats(); st.Bytes > 64<<10 || st.Hits == 0 || st.Evictions == 0 {
		t.Errorf("stats %+v", st)
	}
}

func TestRegisterTwice(t *testing.T) {
	reg := prometheus.NewRegistry()
	if _, err := New(1<<20, reg); err != nil {
		t.Fatal(err)
	}
	if _, err := New(1<<20, reg); err == nil || !strings.Contains(err.Error(), "registering metrics") {
		t.Errorf("second registration: %v", err)
	}
}
