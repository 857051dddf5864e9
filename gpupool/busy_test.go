package gpupool

import (
	"fmt"
	"maps"
	"math"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// waitBusy waits until every GPU of p has at least n busy readings.
func waitBusy(t *testing.T, p *Pool, n uint64) []GPUBusy {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		b := p.Stats().GPUBusy
		done := len(b) > 0
		for _, g := range b {
			done = done && g.Samples >= n
		}
		if done {
			return b
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %d busy readings within 10 s: %+v", n, b)
		}
		time.Sleep(time.Millisecond)
	}
}

// scorer_gpu_busy_ratio follows each GPU's NVML utilization, per GPU, and
// Stats' GPUBusy averages the readings: the gauge moves when the fake's
// utilization does, and a window taken with BusySince holds only the
// readings after its start.
func TestGPUBusyRatio(t *testing.T) {
	reg := prometheus.NewRegistry()
	probe := newFakeProbe(&fakeGPU{total: 80 << 30, util: 40}, &fakeGPU{total: 80 << 30, util: 90})
	p := newPool(t, newFakeFactory(nil), gpuOpts(probe, Registerer(reg), withBusyInterval(time.Millisecond))...)
	mustScore(t, p, makePairs([]int{4, 8}))
	waitBusy(t, p, 1)
	if got, want := gathered(t, reg, "scorer_gpu_busy_ratio", "gpu"), map[string]float64{"cuda:0": 0.4, "cuda:1": 0.9}; !maps.Equal(got, want) {
		t.Errorf("scorer_gpu_busy_ratio = %v, want %v", got, want)
	}

	probe.set(0, func(g *fakeGPU) { g.util = 100 })
	probe.set(1, func(g *fakeGPU) { g.util = 0 })
	// Readings after the change: two more per GPU than the snapshot holds
	// (one may have been taken before the change landed).
	before := p.Stats().GPUBusy
	waitBusy(t, p, before[0].Samples+3)
	if got, want := gathered(t, reg, "scorer_gpu_busy_ratio", "gpu"), map[string]float64{"cuda:0": 1, "cuda:1": 0}; !maps.Equal(got, want) {
		t.Errorf("after the change: scorer_gpu_busy_ratio = %v, want %v", got, want)
	}
	after := p.Stats().GPUBusy
	for i, b := range BusySince(after, before) {
		r, ok := b.Ratio()
		// At most one reading of the window may predate the change.
		lo, hi := float64(b.Samples-1)/float64(b.Samples), 1.0
		if i == 1 {
			lo, hi = 0, 0.9/float64(b.Samples)
		}
		if !ok || r < lo || r > hi {
			t.Errorf("%s: ratio over the window %v (ok %v, %d readings), want in [%.3f, %.3f]", b.Device.Label(), r, ok, b.Samples, lo, hi)
		}
	}
	// The whole life mixes both utilizations: strictly between them.
	if r, _ := after[0].Ratio(); r <= 0.4 || r >= 1 {
		t.Errorf("cuda:0 over the pool's life: %v, want in (0.4, 1)", r)
	}
}

// A CPU pool has no GPU to read: no busy series and no GPUBusy, so nothing
// can print a CPU run as an idle GPU.
func TestGPUBusyNoneOnCPU(t *testing.T) {
	reg := prometheus.NewRegistry()
	probe := newFakeProbe(&fakeGPU{total: 80 << 30, util: 70})
	p := newPool(t, newFakeFactory(nil), Mode(ModeCPU), WithProbe(probe), Registerer(reg), withBusyInterval(time.Millisecond))
	mustScore(t, p, makePairs([]int{4, 8}))
	time.Sleep(20 * time.Millisecond)
	if b := p.Stats().GPUBusy; len(b) != 0 {
		t.Errorf("GPUBusy on the CPU = %+v, want none", b)
	}
	if got := gathered(t, reg, "scorer_gpu_busy_ratio", "gpu"); len(got) != 0 {
		t.Errorf("scorer_gpu_busy_ratio on the CPU = %v, want no series", got)
	}
}

// A GPU whose utilization NVML cannot read (a MIG instance) is marked
// Unsupported with no ratio, not reported as 0% busy.
func TestGPUBusyUnsupported(t *testing.T) {
	reg := prometheus.NewRegistry()
	probe := &utilErrProbe{fakeProbe: newFakeProbe(&fakeGPU{total: 80 << 30, util: 70}),
		err: fmt.Errorf("fake: utilization: %w", ErrNotSupported)}
	p := newPool(t, newFakeFactory(nil), gpuOpts(probe.fakeProbe, WithProbe(probe), Registerer(reg), withBusyInterval(time.Millisecond))...)
	deadline := time.Now().Add(10 * time.Second)
	for !p.Stats().GPUBusy[0].Unsupported {
		if time.Now().After(deadline) {
			t.Fatal("GPUBusy never marked Unsupported")
		}
		time.Sleep(time.Millisecond)
	}
	if _, ok := p.Stats().GPUBusy[0].Ratio(); ok {
		t.Error("an unsupported GPU has a ratio")
	}
	if got := gathered(t, reg, "scorer_gpu_busy_ratio", "gpu"); len(got) != 0 {
		t.Errorf("scorer_gpu_busy_ratio = %v, want no series", got)
	}
}

// utilErrProbe is a fakeProbe whose Utilization fails with err.
type utilErrProbe struct {
	*fakeProbe
	err error
}

func (p *utilErrProbe) Utilization(int) (uint32, error) { return 0, p.err }

// MeasureBusy, for work timed outside a pool, averages the readings
// between its start and its stop.
func TestMeasureBusy(t *testing.T) {
	probe := newFakeProbe(&fakeGPU{total: 80 << 30, util: 30})
	dev := Device{Kind: CUDA, Index: 0}
	stop := MeasureBusy(probe, dev, time.Millisecond)
	time.Sleep(30 * time.Millisecond)
	b := stop()
	if r, ok := b.Ratio(); !ok || r != 0.3 || b.Device != dev {
		t.Errorf("MeasureBusy = %+v (ratio %v, ok %v), want 0.3 of %s", b, r, ok, dev.Label())
	}
	// Two GPUs together pool their readings; an unread one adds nothing.
	if r, ok := MeanBusy([]GPUBusy{b, {Samples: 1, Percent: 90}, {Unsupported: true}}); !ok ||
		math.Abs(r-(float64(b.Percent)+90)/float64(b.Samples+1)/100) > 1e-12 {
		t.Errorf("MeanBusy = %v, %v", r, ok)
	}
	if _, ok := MeanBusy([]GPUBusy{{Unsupported: true}}); ok {
		t.Error("MeanBusy without a reading has a ratio")
	}
	stop = MeasureBusy(&utilErrProbe{fakeProbe: probe, err: fmt.Errorf("fake: %w", ErrNotSupported)}, dev, time.Millisecond)
	time.Sleep(10 * time.Millisecond)
	if b := stop(); !b.Unsupported || b.Samples != 0 {
		t.Errorf("MeasureBusy on an unreadable GPU = %+v, want Unsupported, no readings", b)
	}
}
