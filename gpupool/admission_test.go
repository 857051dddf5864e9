package gpupool

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/scorer/scorer/model"
)

// lenLimitEngine rejects pairs longer than limit with a plain (non-OOM)
// error, as model.Session does past the model's max length, and records the
// longest pair it ran. declare makes it state the limit through MaxLength.
type lenLimitEngine struct {
	fakeEngine
	limit   int
	declare bool

	lmu     sync.Mutex
	longest int
}

func (e *lenLimitEngine) ScorePairs(ctx context.Context, pairs []model.Pair) ([]float32, error) {
	for i, p := range pairs {
		if p.Len() > e.limit {
			return nil, fmt.Errorf("model: pair %d has %d tokens, max length is %d", i, p.Len(), e.limit)
		}
		e.lmu.Lock()
		e.longest = max(e.longest, p.Len())
		e.lmu.Unlock()
	}
	return e.fakeEngine.ScorePairs(ctx, pairs)
}

func (e *lenLimitEngine) MaxLength() int {
	if e.declare {
		return e.limit
	}
	return 0
}

// Calibration never builds pairs longer than the model takes: a 128-token
// model must keep its GPU, whether the caller passes MaxLen, configures
// longer Shapes, or only the engine knows its limit.
func TestCalibrationStaysWithinModelMaxLength(t *testing.T) {
	for _, tc := range []struct {
		name    string
		cal     Calibration
		declare bool
		wantGPU bool
	}{
		{"MaxLen from the model", Calibration{MaxLen: 128}, false, true},
		{"longer Shapes clamped to MaxLen", Calibration{MaxLen: 128, Shapes: []Shape{{Rows: 2, Len: 64}, {Rows: 8, Len: 512}}}, false, true},
		{"engine states its limit", Calibration{}, true, true},
		{"nobody says (the old failure)", Calibration{}, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			probe := newFakeProbe(&fakeGPU{total: 80 << 30})
			var eng *lenLimitEngine
			factory := func(dev Device) (Engine, error) {
				if dev.Kind == CPU {
					return &fakeEngine{dev: dev}, nil
				}
				eng = &lenLimitEngine{fakeEngine: fakeEngine{dev: dev}, limit: 128, declare: tc.declare}
				return eng, nil
			}
			var logs bytes.Buffer
			p, err := New(testCtx(t), factory, Mode(ModeAuto), WithProbe(probe), Calibrate(tc.cal), Logger(zerolog.New(&logs)))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = p.Close(context.Background()) })
			devs := p.Devices()
			if gotGPU := devs[0].Kind == CUDA; gotGPU != tc.wantGPU {
				t.Fatalf("devices %+v (GPU kept = %v, want %v); logs:\n%s", devs, gotGPU, tc.wantGPU, logs.String())
			}
			if !tc.wantGPU {
				return
			}
			if eng.longest == 0 || eng.longest > 128 {
				t.Errorf("longest calibration pair %d, want 1..128", eng.longest)
			}
		})
	}
}

// procProbe is a fakeProbe with per-process readings (ProcessMemoryReader):
// ours is this process's memory on GPU 0; err, when set, is what
// ProcessMemory answers instead.
type procProbe struct {
	*fakeProbe
	pmu  sync.Mutex
	ours uint64
	err  error
}

func (p *procProbe) ProcessMemory(int) (uint64, error) {
	p.pmu.Lock()
	defer p.pmu.Unlock()
	return p.ours, p.err
}

func (p *procProbe) grow(ours, theirs uint64) {
	p.pmu.Lock()
	p.ours += ours
	p.pmu.Unlock()
	p.set(0, func(g *fakeGPU) { g.used += ours + theirs })
}

// Two processes calibrating on one GPU at once: per-process readings keep
// the other's allocations out of our fit and weights; without them (not
// supported, or our PID not listed in a PID namespace) the device-wide
// fallback absorbs them, and the log says which method was used.
func TestCalibrationMeasuresOwnProcessMemory(t *testing.T) {
	const (
		base, perToken = 32 << 20, 20 << 10
		weights        = 600 << 20 // what opening our engine takes
		neighbour      = 300 << 20 // what the other process allocates meanwhile
	)
	for _, tc := range []struct {
		name        string
		perProcess  bool
		err         error
		wantReading string
	}{
		{"per process", true, nil, `"memory_reading":"process"`},
		{"pid not listed", true, ErrProcessNotListed, `"memory_reading":"device"`},
		{"not supported", true, ErrNotSupported, `"memory_reading":"device"`},
		{"probe without per-process readings", false, nil, `"memory_reading":"device"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pp := &procProbe{fakeProbe: newFakeProbe(&fakeGPU{total: 80 << 30, used: 1 << 30}), err: tc.err}
			var probe Probe = pp.fakeProbe
			if tc.perProcess {
				probe = pp
			}
			factory := func(dev Device) (Engine, error) {
				if dev.Kind == CPU {
					return &fakeEngine{dev: dev}, nil
				}
				pp.grow(weights, neighbour)
				// Our arena grows to the largest batch; the neighbour's
				// calibration, in step with ours, grows as much.
				return &fakeEngine{dev: dev, onRun: arenaGrowth(base, perToken, func(n uint64) { pp.grow(n, n) })}, nil
			}
			var logs bytes.Buffer
			p, err := New(testCtx(t), factory, Mode(ModeCUDA), WithProbe(probe), MemFraction(1),
				Calibrate(Calibration{MaxLen: 256}), Logger(zerolog.New(&logs)))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = p.Close(context.Background()) })
			if !strings.Contains(logs.String(), tc.wantReading) {
				t.Errorf("logs lack %s:\n%s", tc.wantReading, logs.String())
			}
			if tc.err != nil && !strings.Contains(logs.String(), tc.err.Error()) {
				t.Errorf("logs lack the fallback's reason %q:\n%s", tc.err, logs.String())
			}
			est := p.devices[0].est
			if tc.wantReading == `"memory_reading":"process"` {
				if d := est.PerToken - perToken; d > 1 || d < -1 {
					t.Errorf("per-token estimate %v, want %v", est.PerToken, perToken)
				}
				if d := est.Base - base; d > 1024 || d < -1024 {
					t.Errorf("base estimate %v, want %v", est.Base, base)
				}
				if est.WeightBytes != weights {
					t.Errorf("weights %d, want %d", est.WeightBytes, weights)
				}
				return
			}
			// Device-wide: the neighbour's growth doubles what we measure.
			if d := est.PerToken - 2*perToken; d > 2 || d < -2 {
				t.Errorf("device-wide per-token estimate %v, want the contaminated %v", est.PerToken, 2*perToken)
			}
			if est.WeightBytes != weights+neighbour {
				t.Errorf("device-wide weights %d, want %d", est.WeightBytes, weights+neighbour)
			}
		})
	}
}

// Used memory may sit above MemFraction for good once our arena has grown to
// gpu_mem_limit beside the CUDA context. A batch the arena already holds
// must still be admitted (it allocates nothing); one that needs more is
// refused on the fraction, and counts the arena once.
func TestAdmissionArenaCoveredBatchIgnoresFraction(t *testing.T) {
	const base, perToken = 32 << 20, 20 << 10
	probe := newFakeProbe(&fakeGPU{total: 80 << 30, used: 100 << 20})
	f := newFakeFactory(map[string]*fakeEngine{"cuda:0": {onRun: arenaGrowth(base, perToken, func(n uint64) {
		probe.set(0, func(g *fakeGPU) { g.used += n })
	})}})
	// Limit 0.02 × 80 GiB ≈ 1638 MiB, of which 768 MiB are CUDA's own
	// (the floor: this engine cannot empty its arena for a measurement);
	// calibration leaves an arena of 32 MiB + 20 KiB × 16384 = 352 MiB.
	p := newPool(t, f, Mode(ModeCUDA), WithProbe(probe), MemFraction(0.02), Calibrate(Calibration{MaxLen: 256}))
	d := p.devices[0]
	if d.arenaPeak < 300<<20 {
		t.Fatalf("arena after calibration %v, want about 352 MiB", d.arenaPeak)
	}
	// Our context and workspaces push used past the limit: 1700 MiB.
	probe.set(0, func(g *fakeGPU) { g.used = 1700 << 20 })
	small := p.admit(d, 4, 256) // about 52 MiB, inside the arena
	if !small.ok || small.reason != "arena" {
		t.Fatalf("batch inside the arena: %+v, want admitted (arena)", small)
	}
	// A second such batch while the first runs still fits the arena.
	second := p.admit(d, 4, 256)
	if !second.ok {
		t.Fatalf("second batch inside the arena: %+v", second)
	}
	p.mu.Lock()
	d.reserved -= small.est + second.est
	p.mu.Unlock()
	big := p.admit(d, 96, 256) // beyond the arena: needs new memory
	if big.ok || big.reason != "mem_fraction" || big.neverFits {
		t.Fatalf("batch beyond the arena: %+v, want refused on mem_fraction", big)
	}
	// End to end: work flows although used stays above the limit.
	mustScore(t, p, makePairs(realisticLengths(200, 3)))
	if st := p.Stats(); st.Devices[0].Batches == 0 || st.Devices[0].Fallback {
		t.Errorf("stats %+v: want the GPU to run the batches", st)
	}
}

// Two scorers share one GPU, each with GPU_MEM_LIMIT=0.45: under a backlog
// in both, each keeps its footprint in its share, CUDA's own memory beside
// the arena included (the first GPU run measured 764 MiB of it, which
// admission used to leave out), so together they never pass the device,
// nothing runs out of memory, and both keep the GPU (neither degrades to
// the CPU).
func TestTwoPoolsShareOneGPU(t *testing.T) {
	const total = 16 << 30
	dev := &fakeDevice{total: total}
	share := MemLimit{Fraction: 0.45}
	var engines []*arenaEngine
	var mu sync.Mutex
	open := func() *Pool {
		factory := func(d Device) (Engine, error) {
			cfg := SessionConfig{GPUMemFraction: 0.9, GPUMemBudget: share}
			cap, _ := strconv.ParseUint(cudaProviderOptions(d, cfg)["gpu_mem_limit"], 10, 64)
			e, err := newArenaEngine(dev, deberta, cap)
			mu.Lock()
			engines = append(engines, e)
			mu.Unlock()
			return e, err
		}
		p, err := New(testCtx(t), factory, Mode(ModeCUDA), WithProbe(deviceProbe{dev}), MemFraction(0.9), GPUMemLimit(share),
			MaxBatchTokens(32768), withAdmissionBackoff(2*time.Millisecond), CPUFallback(false))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Close(context.Background()) })
		return p
	}
	pools := []*Pool{open(), open()}
	calOOMs := 0
	for _, e := range engines {
		calOOMs += e.oomCount()
		// Calibration is bounded by the arena cap, not admission.
		e.ownPeak()
	}
	r := rand.New(rand.NewPCG(7, 3))
	var calls [][]model.Pair
	for range 32 {
		calls = append(calls, makePairs(mixedLengths(r, 100+r.IntN(300))))
	}
	if errs := scoreConcurrently(t, pools, calls); len(errs) > 0 {
		t.Fatal(errs[0])
	}
	ooms := -calOOMs
	for _, e := range engines {
		ooms += e.oomCount()
	}
	for i, p := range pools {
		st := p.Stats()
		if st.Devices[0].Degraded || st.Devices[0].Batches == 0 || len(st.Devices) != 1 {
			t.Errorf("pool %d: %+v, want its GPU in use and no fallback", i, st)
		}
		t.Logf("pool %d: %d batches, %.1f pairs each, %d refusals, %d splits", i, st.Batches, float64(st.Pairs)/float64(st.Batches), st.Refusals, st.Splits)
	}
	if ooms != 0 {
		t.Errorf("%d OOMs after start", ooms)
	}
	for i, e := range engines {
		if own, budget := e.ownPeak(), share.Of(total); own > budget {
			t.Errorf("scorer %d held %d MiB at most (weights, arena, CUDA's own), over its %d MiB share", i, own>>20, budget>>20)
		}
	}
	if limit := uint64(total) / 10 * 9; dev.maxUsed > limit {
		t.Errorf("device peak %d MiB, over the %d MiB the two may use", dev.maxUsed>>20, limit>>20)
	}
	t.Logf("device peak %d of %d MiB", dev.maxUsed>>20, uint64(total)>>20)
}

// neighbourEngine is an arenaEngine on a GPU where another process
// allocates and later frees memory while we calibrate: during given runs
// (counted from 1) it takes or returns bytes.
type neighbourEngine struct {
	*arenaEngine
	mu     sync.Mutex
	runs   int
	events map[int]int64 // run number → bytes the neighbour allocates (<0: frees)
}

func (e *neighbourEngine) ScorePairs(ctx context.Context, pairs []model.Pair) ([]float32, error) {
	e.mu.Lock()
	e.runs++
	if n, ok := e.events[e.runs]; ok {
		if n > 0 {
			e.dev.alloc(uint64(n))
		} else {
			e.dev.free(uint64(-n))
		}
	}
	e.mu.Unlock()
	return e.arenaEngine.ScorePairs(ctx, pairs)
}

// A neighbour's allocations and frees during our calibration (device-wide
// readings: NVML cannot list our PID in a container) do not skew the fit.
func TestCalibrationIgnoresNeighbour(t *testing.T) {
	for _, events := range []map[int]int64{
		{4: 3 << 30, 14: -(3 << 30)},             // a burst that comes and goes
		{3: 2 << 30, 9: -(2 << 30), 20: 1 << 30}, // several
	} {
		dev := &fakeDevice{total: 80 << 30}
		factory := func(Device) (Engine, error) {
			e, err := newArenaEngine(dev, deberta, 0)
			return &neighbourEngine{arenaEngine: e, events: events}, err
		}
		p, err := New(testCtx(t), factory, Mode(ModeCUDA), WithProbe(deviceProbe{dev}), MaxBatchTokens(16384))
		if err != nil {
			t.Fatal(err)
		}
		est := p.devices[0].est
		p.Close(context.Background())
		wantC := float64(deberta.heads) * deberta.perScore
		if rel(est.PerToken, deberta.perToken) > 0.05 || rel(est.PerTokenLen, wantC) > 0.05 {
			t.Errorf("neighbour events %v: fit per token %.4g (want %.4g), per token·len %.4g (want %.4g)",
				events, est.PerToken, deberta.perToken, est.PerTokenLen, wantC)
		}
	}
}

// Admission counts what CUDA takes beside the weights and the arena: an
// engine that can empty its arena gets it measured after its two workers
// ran at once (context plus a workspace each), one that cannot gets the
// DefaultGPUMemMargin floor, at least the 764 MiB the first GPU run
// measured. A batch that fits the share beside the weights alone, but not
// beside CUDA's memory too, is refused, as the arena cap would fail it.
func TestAdmissionCountsMemoryBesideArena(t *testing.T) {
	if DefaultGPUMemMargin < 764<<20 {
		t.Fatalf("DefaultGPUMemMargin %d MiB, below the 764 MiB measured on an H200", DefaultGPUMemMargin>>20)
	}
	dev := &fakeDevice{total: 16 << 30}
	share := MemLimit{Fraction: 0.45}
	factory := func(Device) (Engine, error) { return newArenaEngine(dev, deberta, 0) }
	p, err := New(testCtx(t), factory, Mode(ModeCUDA), WithProbe(deviceProbe{dev}), MemFraction(0.9), GPUMemLimit(share),
		CPUFallback(false))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close(context.Background())
	st := p.Stats().Devices[0]
	want := float64(deberta.context + 2*deberta.stream)
	if !st.Memory.BesideArenaMeasured || st.Memory.BesideArenaBytes < want || st.Memory.BesideArenaBytes > want+2*arenaChunk {
		t.Fatalf("beside the arena: %.0f MiB (measured %v), want the %.0f MiB two workers' runs took",
			st.Memory.BesideArenaBytes/(1<<20), st.Memory.BesideArenaMeasured, want/(1<<20))
	}
	d := p.devices[0]
	budget := float64(share.Of(dev.total))
	rows := d.est.MaxRows(512, budget-float64(d.est.WeightBytes)-float64(p.cfg.headroom))
	if a := p.admit(d, rows, 512); a.ok {
		t.Errorf("%d×512 (%.0f MiB) beside %d MiB of weights and %.0f MiB of CUDA's own, in a %.0f MiB share: admitted (%s)",
			rows, a.est/(1<<20), d.est.WeightBytes>>20, d.est.BesideArenaBytes/(1<<20), budget/(1<<20), a.reason)
	}
	// The exported model is the one admission and the planner use: its
	// budget is the share, its room takes off the weights, CUDA's own
	// memory and the headroom, and the planner's row cap is MaxRows there.
	mm := st.Memory
	if mm.BudgetBytes != budget || mm.HeadroomBytes != float64(p.cfg.headroom) || mm.WeightBytes != d.est.WeightBytes {
		t.Errorf("Stats' memory model: budget %.0f, headroom %.0f, weights %d; want %.0f, %d, %d",
			mm.BudgetBytes, mm.HeadroomBytes, mm.WeightBytes, budget, p.cfg.headroom, d.est.WeightBytes)
	}
	room := budget - float64(mm.WeightBytes) - mm.BesideArenaBytes - float64(p.cfg.headroom)
	for _, l := range []int{16, 128, 512} {
		want := max(1, mm.MaxRows(l, room))
		if got := p.rowCapFunc()(l); got != want || mm.MaxRows(l, mm.Room(mm.BudgetBytes)) != mm.MaxRows(l, room) {
			t.Errorf("length %d: planner caps at %d rows, the model's room gives %d", l, got, want)
		}
		if fits := mm.MaxRows(l, mm.Room(mm.BudgetBytes)); fits > 0 {
			a := p.admit(d, fits, l)
			if a.neverFits {
				t.Errorf("%d×%d fits the model's room but admission says it never fits (%s)", fits, l, a.reason)
			}
			if a.ok {
				p.mu.Lock()
				d.reserved -= a.est
				p.mu.Unlock()
			}
		}
	}

	unmeasured := newPool(t, newFakeFactory(nil), Mode(ModeCUDA), WithProbe(newFakeProbe(&fakeGPU{total: 16 << 30})))
	if st := unmeasured.Stats().Devices[0]; st.Memory.BesideArenaMeasured || st.Memory.BesideArenaBytes != DefaultGPUMemMargin {
		t.Errorf("engine that cannot empty its arena: beside %.0f MiB (measured %v), want the %d MiB floor",
			st.Memory.BesideArenaBytes/(1<<20), st.Memory.BesideArenaMeasured, DefaultGPUMemMargin>>20)
	}
}
