package gpupool

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/rs/zerolog"

	"github.com/scorer/scorer/model"
)

// keyedArena is a fake CUDA session that names what its memory depends on,
// as model.Session does, and counts the calibration shapes it ran: every
// run bigger than the one-row warm-up and beside-the-arena runs.
type keyedArena struct {
	*arenaEngine
	key string

	mu     sync.Mutex
	ladder int
}

func (e *keyedArena) MemoryKey() string { return e.key }

func (e *keyedArena) ScorePairs(ctx context.Context, pairs []model.Pair) ([]float32, error) {
	if len(pairs) > 1 || pairs[0].Len() > 8 {
		e.mu.Lock()
		e.ladder++
		e.mu.Unlock()
	}
	return e.arenaEngine.ScorePairs(ctx, pairs)
}

func (e *keyedArena) ladderRuns() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.ladder
}

// uuidProbe is a deviceProbe whose GPU has another UUID.
type uuidProbe struct {
	deviceProbe
	uuid string
}

func (p uuidProbe) Devices() ([]DeviceInfo, error) {
	d, err := p.deviceProbe.Devices()
	d[0].UUID = p.uuid
	return d, err
}

// gpuStart is one process start on a fresh 80 GiB fake GPU.
type gpuStart struct {
	pool *Pool
	eng  *keyedArena
	logs string
}

const cacheKeyA = "model=aaa max_len=512 ort=1.30.0 output=FLOAT configure=\"cuda use_tf32=1\""

// startGPU starts a CUDA pool on a DeBERTa-like fake engine naming key,
// on a GPU with uuid, keeping calibrations in dir ("" = off).
func startGPU(t *testing.T, key, uuid, dir string, opts ...Option) gpuStart {
	t.Helper()
	dev := &fakeDevice{total: 80 << 30}
	var eng *keyedArena
	factory := func(Device) (Engine, error) {
		// No per-run workspace: the fake would hold a lone warm-up run a
		// second waiting for a second run to overlap it, at every start.
		mem := deberta
		mem.stream = 0
		a, err := newArenaEngine(dev, mem, 0)
		if err != nil {
			return nil, err
		}
		eng = &keyedArena{arenaEngine: a, key: key}
		return eng, nil
	}
	var logs bytes.Buffer
	p, err := New(testCtx(t), factory, append([]Option{Mode(ModeCUDA), WithProbe(uuidProbe{deviceProbe{dev}, uuid}),
		MaxBatchTokens(16384), CPUFallback(false), GPUCalibrationCache(dir), Logger(zerolog.New(&logs))}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close(context.Background()) })
	return gpuStart{pool: p, eng: eng, logs: logs.String()}
}

// TestGPUCalibrationCache: a second start with the same key runs no
// calibration shape, takes the first start's fit and admits exactly as it
// did, while still measuring what CUDA takes beside the arena; another GPU,
// model, ONNX Runtime, precision or calibration shapes calibrate again (and
// are kept beside it); a damaged file is measured again and overwritten;
// with the cache off nothing is read or written. Each start logs which.
func TestGPUCalibrationCache(t *testing.T) {
	dir := t.TempDir()
	files := func(t *testing.T) []string {
		t.Helper()
		m, err := filepath.Glob(filepath.Join(dir, "*"))
		if err != nil {
			t.Fatal(err)
		}
		return m
	}

	first := startGPU(t, cacheKeyA, "GPU-a", dir)
	if n := first.eng.ladderRuns(); n == 0 {
		t.Fatal("first start ran no calibration shape")
	}
	if !strings.Contains(first.logs, "GPU memory calibrated (cache miss: none kept)") {
		t.Errorf("first start's log says nothing of the miss:\n%s", first.logs)
	}
	kept := files(t)
	if len(kept) != 1 || !strings.HasPrefix(filepath.Base(kept[0]), "gpu-") {
		t.Fatalf("cache files after the first start: %v, want one gpu-*.json", kept)
	}
	path := kept[0]

	again := startGPU(t, cacheKeyA, "GPU-a", dir)
	if n := again.eng.ladderRuns(); n != 0 {
		t.Errorf("same key: %d calibration shapes ran, want none", n)
	}
	if !strings.Contains(again.logs, "GPU memory calibration taken from cache") || !strings.Contains(again.logs, path) {
		t.Errorf("same key: the log does not say the calibration came from %s:\n%s", path, again.logs)
	}
	a, b := first.pool.devices[0], again.pool.devices[0]
	if gpuFitOf(a.est) != gpuFitOf(b.est) || !b.est.Calibrated {
		t.Errorf("same key: fit %+v, want the first start's %+v", gpuFitOf(b.est), gpuFitOf(a.est))
	}
	if b.est.arena != a.est.arena {
		t.Errorf("same key: %.0f bytes counted as arena, want the first start's %.0f", b.est.arena, a.est.arena)
	}
	if !b.est.BesideArenaMeasured || b.est.BesideArenaBytes != a.est.BesideArenaBytes || b.est.WeightBytes != a.est.WeightBytes || b.est.usedBase != a.est.usedBase {
		t.Errorf("same key: beside %.0f (measured %v), weights %d, used base %d; want the first start's %.0f, %d, %d measured now",
			b.est.BesideArenaBytes, b.est.BesideArenaMeasured, b.est.WeightBytes, b.est.usedBase, a.est.BesideArenaBytes, a.est.WeightBytes, a.est.usedBase)
	}
	for _, s := range []Shape{{1, 8}, {341, 48}, {64, 256}, {32, 512}} {
		da, db := a.est.MaxRows(s.Len, 40<<30), b.est.MaxRows(s.Len, 40<<30)
		ea, eb := first.pool.admit(a, s.Rows, s.Len), again.pool.admit(b, s.Rows, s.Len)
		if da != db || ea.ok != eb.ok || ea.est != eb.est {
			t.Errorf("%d×%d: the cached start admits %v (%.0f bytes, %d rows fit), the measured one %v (%.0f, %d)",
				s.Rows, s.Len, eb.ok, eb.est, db, ea.ok, ea.est, da)
		}
		unreserve(first.pool, a, ea)
		unreserve(again.pool, b, eb)
	}
	mustScore(t, again.pool, makePairs(mixedLengths(rand.New(rand.NewPCG(1, 2)), 300)))

	for _, tc := range []struct {
		name, key, uuid string
		opts            []Option
	}{
		{"other GPU", cacheKeyA, "GPU-b", nil},
		{"other model", strings.Replace(cacheKeyA, "model=aaa", "model=bbb", 1), "GPU-a", nil},
		{"other ONNX Runtime", strings.Replace(cacheKeyA, "ort=1.30.0", "ort=1.31.0", 1), "GPU-a", nil},
		{"other precision", strings.Replace(cacheKeyA, "output=FLOAT", "output=FLOAT16", 1), "GPU-a", nil},
		{"TF32 off", strings.Replace(cacheKeyA, "use_tf32=1", "use_tf32=0", 1), "GPU-a", nil},
		{"other shapes", cacheKeyA, "GPU-a", []Option{MaxBatchTokens(8192)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := len(files(t))
			s := startGPU(t, tc.key, tc.uuid, dir, tc.opts...)
			if s.eng.ladderRuns() == 0 || !strings.Contains(s.logs, "cache miss: none kept") {
				t.Errorf("took a kept calibration (%d shapes ran):\n%s", s.eng.ladderRuns(), s.logs)
			}
			if n := len(files(t)); n != before+1 {
				t.Errorf("%d cache files, want %d: each key is kept beside the others", n, before+1)
			}
			if s := startGPU(t, tc.key, tc.uuid, dir, tc.opts...); s.eng.ladderRuns() != 0 {
				t.Errorf("its own calibration was not kept: %d shapes ran at the next start", s.eng.ladderRuns())
			}
		})
	}

	for name, damage := range damageCacheFile(t, path, "model=aaa", "model=zzz", func(f *gpuFit) { f.PerTokenLen, f.HeldOut = -1, 0.9 }) {
		t.Run(name, func(t *testing.T) {
			damage(t)
			s := startGPU(t, cacheKeyA, "GPU-a", dir)
			if s.eng.ladderRuns() == 0 || !strings.Contains(s.logs, "cache miss: ") {
				t.Fatalf("a damaged cache file was trusted:\n%s", s.logs)
			}
			if gpuFitOf(s.pool.devices[0].est) != gpuFitOf(a.est) {
				t.Errorf("measured again: fit %+v, want %+v", gpuFitOf(s.pool.devices[0].est), gpuFitOf(a.est))
			}
			if s := startGPU(t, cacheKeyA, "GPU-a", dir); s.eng.ladderRuns() != 0 {
				t.Errorf("the file was not overwritten: %d shapes ran at the next start", s.eng.ladderRuns())
			}
		})
	}

	t.Run("off", func(t *testing.T) {
		for range 2 {
			s := startGPU(t, cacheKeyA, "GPU-a", "")
			if s.eng.ladderRuns() == 0 || !strings.Contains(s.logs, "cache miss: cache off") {
				t.Errorf("cache off: %d shapes ran, log:\n%s", s.eng.ladderRuns(), s.logs)
			}
		}
	})
	t.Run("engine that cannot run", func(t *testing.T) {
		dir := t.TempDir()
		start := func(fail error) error {
			// Per-process readings: device-wide high-water marks are not
			// kept (TestGPUCalibrationNotKeptAfterNeighbour).
			probe := &procProbe{fakeProbe: newFakeProbe(&fakeGPU{total: 80 << 30})}
			f := &fakeEngine{maxLength: 512, err: fail}
			f.onRun = arenaGrowth(64<<20, 64<<10, func(n uint64) { probe.grow(n, 0) })
			p, err := New(testCtx(t), func(Device) (Engine, error) { return keyedEngine{fakeEngine: f, key: cacheKeyA}, nil },
				Mode(ModeCUDA), WithProbe(probe), CPUFallback(false), GPUCalibrationCache(dir))
			if err == nil {
				t.Cleanup(func() { _ = p.Close(context.Background()) })
			}
			return err
		}
		if err := start(nil); err != nil {
			t.Fatal(err)
		}
		if m, _ := filepath.Glob(filepath.Join(dir, "gpu-*.json")); len(m) != 1 {
			t.Fatalf("kept %v, want one file", m)
		}
		if err := start(errFakeCUDA); err == nil {
			t.Error("with a kept calibration, an engine that cannot run joined the pool")
		}
	})
	t.Run("no key", func(t *testing.T) {
		for range 2 {
			s := startGPU(t, "", "GPU-a", dir)
			if s.eng.ladderRuns() == 0 || !strings.Contains(s.logs, "no memory key") {
				t.Errorf("an engine with no key: %d shapes ran, log:\n%s", s.eng.ladderRuns(), s.logs)
			}
		}
	})
	t.Run("unusable directory", func(t *testing.T) {
		notDir := filepath.Join(t.TempDir(), "file")
		if err := os.WriteFile(notDir, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		s := startGPU(t, cacheKeyA, "GPU-a", notDir)
		if st := s.pool.Stats().Devices[0]; s.eng.ladderRuns() == 0 || st.Memory.PerTokenLen <= 0 || !strings.Contains(s.logs, "not kept") {
			t.Errorf("a cache directory that cannot be made: %d shapes ran, estimate %+v; want a measured fit, a start and the log saying it was not kept:\n%s",
				s.eng.ladderRuns(), st, s.logs)
		}
	})
}

// unreserve gives back what an admission test reserved.
func unreserve(p *Pool, d *device, a admission) {
	if a.ok {
		p.mu.Lock()
		d.reserved -= a.est
		p.mu.Unlock()
	}
}

// neighbourKeyed is a neighbourEngine that names what its memory depends
// on, so its calibration can be kept.
type neighbourKeyed struct {
	*neighbourEngine
	key string
}

func (e neighbourKeyed) MemoryKey() string { return e.key }

// ownProbe is a deviceProbe with per-process readings, as NVML gives where
// it lists our PID: the weights, arena and CUDA memory of the engine the
// pool opened, none of the neighbour's.
type ownProbe struct {
	deviceProbe
	eng *atomic.Pointer[arenaEngine]
}

func (p ownProbe) ProcessMemory(int) (uint64, error) {
	e := p.eng.Load()
	if e == nil {
		return 0, ErrProcessNotListed
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.mem.weights + e.arena + e.beside, nil
}

// TestGPUCalibrationNotKeptAfterNeighbour: a calibration read device-wide
// (NVML does not list our PID inside a container) while another process
// allocated or freed on the GPU counts that process in its readings; the
// fit is used for this start but not kept, and the log says why, so no
// later start inherits the skew. A neighbour that only sits on the GPU
// moves nothing we read and does not stop a quiet calibration being kept,
// nor does any neighbour stop one read per process. Device-wide readings
// of an engine that cannot empty its arena cannot tell the two apart and
// are not kept either.
func TestGPUCalibrationNotKeptAfterNeighbour(t *testing.T) {
	start := func(t *testing.T, dir string, events map[int]int64, perProcess bool) (*Pool, string) {
		t.Helper()
		// The neighbour's 2 GiB was there before we started.
		dev := &fakeDevice{total: 80 << 30, used: 2 << 30}
		var own atomic.Pointer[arenaEngine]
		factory := func(Device) (Engine, error) {
			mem := deberta
			mem.stream = 0 // as startGPU: no second-long wait for overlapping runs
			a, err := newArenaEngine(dev, mem, 0)
			if err != nil {
				return nil, err
			}
			own.Store(a)
			return neighbourKeyed{&neighbourEngine{arenaEngine: a, events: events}, cacheKeyA}, nil
		}
		var probe Probe = deviceProbe{dev}
		if perProcess {
			probe = ownProbe{deviceProbe{dev}, &own}
		}
		var logs bytes.Buffer
		p, err := New(testCtx(t), factory, Mode(ModeCUDA), WithProbe(probe), MaxBatchTokens(16384), CPUFallback(false),
			GPUCalibrationCache(dir), Logger(zerolog.New(&logs)))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = p.Close(context.Background()) })
		return p, logs.String()
	}
	kept := func(t *testing.T, dir string) []string {
		t.Helper()
		m, err := filepath.Glob(filepath.Join(dir, "gpu-*.json"))
		if err != nil {
			t.Fatal(err)
		}
		return m
	}

	quiet, logs := start(t, t.TempDir(), nil, false)
	if !strings.Contains(logs, `"memory_reading":"device"`) {
		t.Fatalf("the quiet start did not read device-wide:\n%s", logs)
	}
	// Runs are counted from the warm-up: three per shape on device-wide
	// readings, so the ladder's last run is 1+3·shapes.
	last := 1 + 3*len(defaultShapes(quiet.cfg.maxBatchTokens, quiet.cfg.maxBatchRows, 512))

	for _, tc := range []struct {
		name       string
		events     map[int]int64
		perProcess bool
		wantKept   bool
	}{
		{"quiet", nil, false, true},
		{"comes and goes", map[int]int64{4: 3 << 30, 14: -(3 << 30)}, false, false},
		{"frees what it held", map[int]int64{6: -(1 << 30)}, false, false},
		{"stays", map[int]int64{5: 1 << 30}, false, false},
		{"during the last shape", map[int]int64{last: 512 << 20}, false, false},
		{"comes and goes, per-process readings", map[int]int64{4: 3 << 30, 14: -(3 << 30)}, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			_, logs := start(t, dir, tc.events, tc.perProcess)
			files := kept(t, dir)
			if tc.wantKept {
				if len(files) != 1 || strings.Contains(logs, "not kept") {
					t.Fatalf("kept %v, want the fit kept:\n%s", files, logs)
				}
				if _, logs := start(t, dir, nil, tc.perProcess); !strings.Contains(logs, "GPU memory calibration taken from cache") {
					t.Errorf("the next start did not take the kept fit:\n%s", logs)
				}
				return
			}
			if len(files) != 0 {
				t.Fatalf("kept %v: a fit read while another process allocated or freed on the GPU", files)
			}
			if !strings.Contains(logs, "not kept: device-wide used memory") || !strings.Contains(logs, "another process") {
				t.Errorf("the log does not say why the fit was not kept:\n%s", logs)
			}
			if _, logs := start(t, dir, nil, false); !strings.Contains(logs, "cache miss: none kept") {
				t.Errorf("the next start did not measure again:\n%s", logs)
			}
		})
	}

	t.Run("arena never emptied", func(t *testing.T) {
		dir := t.TempDir()
		probe := newFakeProbe(&fakeGPU{total: 80 << 30})
		f := &fakeEngine{maxLength: 512}
		f.onRun = arenaGrowth(64<<20, 64<<10, func(n uint64) { probe.set(0, func(g *fakeGPU) { g.used += n }) })
		var logs bytes.Buffer
		p, err := New(testCtx(t), func(Device) (Engine, error) { return keyedEngine{fakeEngine: f, key: cacheKeyA}, nil },
			Mode(ModeCUDA), WithProbe(probe), CPUFallback(false), GPUCalibrationCache(dir), Logger(zerolog.New(&logs)))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = p.Close(context.Background()) })
		if files := kept(t, dir); len(files) != 0 || !strings.Contains(logs.String(), "not kept: device-wide") {
			t.Errorf("device-wide high-water readings: kept %v, want none and the reason logged:\n%s", files, logs.String())
		}
	})
}

// A GPU calibration read device-wide and kept by the release before
// calibrate checked for other processes may carry a neighbour's
// allocations; a start must measure again rather than take it. The file is
// written exactly as that release wrote it (key, name, layout).
func TestGPUCalibrationCacheOfUncheckedDeviceReadingNotReused(t *testing.T) {
	dir := t.TempDir()
	// startGPU's pool: the default MaxBatchRows (256), the engine's maximum
	// length 512, token 1, an engine that empties its arena.
	key := fmt.Sprintf("v=%d %s gpu=%s name=%q total=%d shapes=%v token_id=%d reading=%s emptied=%t",
		1, cacheKeyA, "GPU-a", "Fake GPU", uint64(80<<30), defaultShapes(16384, 256, 512), 1, "device", true)
	path := writePreviousCacheFile(t, dir, "gpu", key, `
  "fit": {
    "base_bytes": 67108864,
    "bytes_per_row": 2726297.6,
    "bytes_per_token": 204800,
    "bytes_per_token_len": 600,
    "held_out_error": 0.02
  },
  "points": [
    {
      "rows": 85,
      "len": 16,
      "bytes": 3288334336
    }
  ],
  "calibrated": "2026-11-20T10:00:00Z"
}
`)
	s := startGPU(t, cacheKeyA, "GPU-a", dir)
	if !strings.Contains(s.logs, `"memory_reading":"device"`) {
		t.Fatalf("did not read device-wide:\n%s", s.logs)
	}
	if s.eng.ladderRuns() == 0 || !strings.Contains(s.logs, "cache miss: none kept") {
		t.Errorf("took the unchecked device-wide fit from %s (%d shapes ran):\n%s", path, s.eng.ladderRuns(), s.logs)
	}
}
