package scoring

import (
	"bufio"
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/rs/zerolog"

	"github.com/scorer/scorer/gpupool"
	"github.com/scorer/scorer/internal/config"
	"github.com/scorer/scorer/model"
)

// graphCache follows the CPU session's GRAPH_CACHE: whether the session
// was loaded from it (logged once the pool is open) and the background
// write of the entry a later start loads when it was not.
type graphCache struct {
	mu   sync.Mutex
	sess *model.Session // the CPU session that missed; nil on a hit or with none

	cancel context.CancelFunc
	done   chan struct{} // closed when the write ended; nil when none started
}

// watch wraps factory so that each CPU session's use of GRAPH_CACHE is
// logged, and a session that did not load from it is kept for the write.
func (g *graphCache) watch(factory gpupool.EngineFactory, log zerolog.Logger) gpupool.EngineFactory {
	return func(dev gpupool.Device) (gpupool.Engine, error) {
		t0 := time.Now()
		eng, err := factory(dev)
		s, ok := eng.(*model.Session)
		if err != nil || !ok || dev.Kind != gpupool.CPU {
			return eng, err
		}
		r := s.GraphCache()
		switch {
		case r.Hit():
			log.Info().Str("dir", r.Path).Dur("session", time.Since(t0)).
				Msg("CPU session loaded from the graph cache: ONNX Runtime's optimised graph and prepacked weights written at an earlier start")
		case r.Path != "":
			log.Info().Str("dir", r.Path).Str("miss", r.Miss).Dur("session", time.Since(t0)).
				Msg("CPU session created without the graph cache")
			g.mu.Lock()
			g.sess = s
			g.mu.Unlock()
		}
		return eng, err
	}
}

// graphCacheHeadroom is how much memory, as a multiple of the model's
// files, writing the graph cache takes beside the scorer while ORT builds
// the session it saves (the optimiser's copies and the packed weights):
// 1.91 GB peak for the 1.74 GB production stand-in in a process of its
// own, which includes the model's load (docs/benchmarks.md).
const graphCacheHeadroom = 1.25

// graphCacheDisk is the free disk space, as a multiple of the model's
// files, a write needs: the entry (1.75 times the production stand-in)
// and the entry it replaces, which is removed only after.
const graphCacheDisk = 2.0

// start writes the graph cache in the background when the CPU session did
// not load from it, unless the CPU memory budget (CPU_MEM_LIMIT less the
// reserve) leaves no room for the session that writes it beside the
// scorer's. It runs at the lowest CPU priority (model.BuildGraphCache).
func (g *graphCache) start(cfg config.Config, log zerolog.Logger) {
	g.mu.Lock()
	defer g.mu.Unlock()
	s := g.sess
	if s == nil || g.done != nil {
		return
	}
	var size int64
	for _, f := range s.Model().Files() {
		if st, err := os.Stat(f); err == nil {
			size += st.Size()
		}
	}
	need := uint64(graphCacheHeadroom * float64(size))
	if mem, _, err := cfg.CPUMemory(config.DetectHost()); err == nil && mem != nil && mem.Limit > 0 {
		rss := residentBytes()
		if rss+mem.Reserve+need > mem.Limit {
			log.Info().Uint64("limit_bytes", mem.Limit).Uint64("resident_bytes", rss).Uint64("reserve_bytes", mem.Reserve).
				Uint64("needs_bytes", need).Msg("graph cache not written: writing it needs about this much memory beside the scorer, more than CPU_MEM_LIMIT leaves; the next start optimises the graph again")
			return
		}
	}
	// The entry is the weights and their packed copies: 1.75 times the
	// production stand-in's 1.74 GB.
	if free, ok := freeBytes(s.GraphCacheDir()); ok && free < uint64(graphCacheDisk*float64(size)) {
		log.Info().Str("dir", s.GraphCacheDir()).Uint64("free_bytes", free).Uint64("needs_bytes", uint64(graphCacheDisk*float64(size))).
			Msg("graph cache not written: not enough free disk space there; the next start optimises the graph again")
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	g.cancel, g.done = cancel, make(chan struct{})
	go func() {
		defer close(g.done)
		t0 := time.Now()
		dir, err := s.BuildGraphCache(ctx)
		if err != nil {
			log.Warn().Err(err).Msg("graph cache not written; the next start optimises the graph again")
			return
		}
		log.Info().Str("dir", dir).Dur("took", time.Since(t0)).Msg("graph cache written: the next start loads the optimised graph from it")
	}()
}

// finish ends the write: it waits for it when wait (GRAPH_CACHE_WAIT) until
// ctx ends, else stops it. ONNX Runtime's session creation cannot be
// interrupted, so a write may go on after finish returns; it keeps the
// environment loaded for itself (ortenv.Pin, in model.BuildGraphCache).
func (g *graphCache) finish(ctx context.Context, wait bool, log zerolog.Logger) {
	g.mu.Lock()
	done, cancel := g.done, g.cancel
	g.mu.Unlock()
	if done == nil {
		return
	}
	if wait {
		select {
		case <-done:
			return
		default:
		}
		log.Info().Msg("waiting for the graph cache to be written (GRAPH_CACHE_WAIT)")
		select {
		case <-done:
			return
		case <-ctx.Done():
		}
	}
	cancel()
	select {
	case <-done:
	default:
		log.Info().Msg("graph cache not written yet as the scorer stops: a process that exits now leaves it to the next start")
	}
}

// freeBytes is the disk space free to this process on the file system
// that holds dir, or its nearest folder that exists.
func freeBytes(dir string) (uint64, bool) {
	for {
		var st syscall.Statfs_t
		if err := syscall.Statfs(dir, &st); err == nil {
			return st.Bavail * uint64(st.Bsize), true
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return 0, false
		}
		dir = parent
	}
}

// residentBytes is this process's resident memory (VmRSS), 0 where it
// cannot be read.
func residentBytes() uint64 {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err == nil {
				return kb << 10
			}
		}
	}
	return 0
}
