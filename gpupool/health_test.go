package gpupool

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/scorer/scorer/model"
)

// flakyEngine fails every run while failing is set, as a GPU does through
// a transient fault, and works again once it is cleared.
type flakyEngine struct {
	fakeEngine
	failing atomic.Bool
}

func (e *flakyEngine) ScorePairs(ctx context.Context, pairs []model.Pair) ([]float32, error) {
	if e.failing.Load() {
		return nil, errFakeCUDA
	}
	return e.fakeEngine.ScorePairs(ctx, pairs)
}

// A GPU degraded by failures is not lost until restart: after its
// probation a re-probe that fails keeps it out, one that passes brings it
// back with workers, and scorer_gpu_degraded follows.
func TestDegradedGPUReprobedAfterProbation(t *testing.T) {
	probe := newFakeProbe(&fakeGPU{total: 80 << 30})
	gpu := &flakyEngine{}
	factory := func(d Device) (Engine, error) {
		if d.Kind == CUDA {
			return gpu, nil
		}
		return &fakeEngine{}, nil
	}
	reg := prometheus.NewRegistry()
	p, err := New(testCtx(t), factory, Mode(ModeAuto), WithProbe(probe), Calibrate(Calibration{Disabled: true}), // auto: the CPU fallback carries the load
		Probation(100*time.Millisecond), withMaxAttempts(100), Registerer(reg))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close(context.Background())
	degraded := func() float64 {
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() != "scorer_gpu_degraded" {
				continue
			}
			for _, m := range mf.GetMetric() {
				for _, l := range m.GetLabel() {
					if l.GetName() == "device" && l.GetValue() == "cuda:0" {
						return m.GetGauge().GetValue()
					}
				}
			}
		}
		t.Fatal("no scorer_gpu_degraded{device=cuda:0} series")
		return 0
	}
	gpu.failing.Store(true)
	mustScore(t, p, makePairs([]int{10, 12, 14})) // fails over to the CPU fallback
	if st := p.Stats(); !st.Devices[0].Degraded || degraded() != 1 {
		t.Fatalf("after failures: degraded %v, gauge %v; want degraded, 1", st.Devices[0].Degraded, degraded())
	}
	time.Sleep(250 * time.Millisecond) // at least one failed re-probe
	if !p.Stats().Devices[0].Degraded {
		t.Fatal("a GPU still failing passed its re-probe")
	}
	gpu.failing.Store(false)
	deadline := time.Now().Add(5 * time.Second)
	for p.Stats().Devices[0].Degraded {
		if time.Now().After(deadline) {
			t.Fatal("the recovered GPU was not brought back")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if degraded() != 0 {
		t.Errorf("gauge %v after recovery, want 0", degraded())
	}
	before := p.Stats().Devices[0].Batches
	for range 20 {
		mustScore(t, p, makePairs([]int{10, 12, 14}))
	}
	// The CPU fallback is the last resort: the recovered GPU takes it all.
	if st := p.Stats(); st.Devices[0].Batches != before+20 {
		t.Errorf("the recovered GPU took %d of 20 batches: %+v", st.Devices[0].Batches-before, st)
	}
}

func TestHotDeviceTakesSmallerShare(t *testing.T) {
	probe := newFakeProbe(&fakeGPU{total: 80 << 30, util: 99}, &fakeGPU{total: 80 << 30})
	f := newFakeFactory(map[string]*fakeEngine{
		"cuda:0": {delay: 2 * time.Millisecond},
		"cuda:1": {delay: 2 * time.Millisecond},
	})
	p := newPool(t, f, gpuOpts(probe, MaxBatchRows(4), WorkersPerDevice(1), withAdmissionBackoff(10*time.Millisecond))...)
	pairs := makePairs(make40(4))
	if _, err := p.ScorePairs(testCtx(t), append(pairs, makePairs(make40(4))...)); err != nil {
		t.Fatal(err)
	}
	st := p.Stats()
	t.Logf("hot device %d batches, cool %d", st.Devices[0].Batches, st.Devices[1].Batches)
	if !st.Devices[0].Hot || st.Devices[0].Batches*2 > st.Devices[1].Batches {
		t.Errorf("hot device ran %d batches, cool %d: want the hot one marked and at most half", st.Devices[0].Batches, st.Devices[1].Batches)
	}
	// Hysteresis: 90% is between cool (80) and hot (95): stays hot.
	probe.set(0, func(g *fakeGPU) { g.util = 90 })
	p.updateHeat(p.devices[0])
	if !p.Stats().Devices[0].Hot {
		t.Error("device cooled at 90% utilization; hysteresis should keep it hot until < 80%")
	}
	probe.set(0, func(g *fakeGPU) { g.util = 50 })
	p.updateHeat(p.devices[0])
	if p.Stats().Devices[0].Hot {
		t.Error("device still hot at 50% utilization")
	}
	probe.set(0, func(g *fakeGPU) { g.throttle = 0x40 }) // HW thermal slowdown
	p.updateHeat(p.devices[0])
	if !p.Stats().Devices[0].Hot {
		t.Error("thermal throttling did not make the device hot")
	}
}
