package gpupool

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"

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
				if d := est.perToken - perToken; d > 1 || d < -1 {
					t.Errorf("per-token estimate %v, want %v", est.perToken, perToken)
				}
				if d := est.base - base; d > 1024 || d < -1024 {
					t.Errorf("base estimate %v, want %v", est.base, base)
				}
				if est.weights != weights {
					t.Errorf("weights %d, want %d", est.weights, weights)
				}
				return
			}
			// Device-wide: the neighbour's growth doubles what we measure.
			if d := est.perToken - 2*perToken; d > 2 || d < -2 {
				t.Errorf("device-wide per-token estimate %v, want the contaminated %v", est.perToken, 2*perToken)
			}
			if est.weights != weights+neighbour {
				t.Errorf("device-wide weights %d, want %d", est.weights, weights+neighbour)
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
