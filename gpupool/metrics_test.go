package gpupool

import (
	"errors"
	"fmt"
	"maps"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// gathered reads one metric family from reg as label value → value, keyed
// by the one label the family has.
func gathered(t *testing.T, reg *prometheus.Registry, name, label string) map[string]float64 {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == label {
					out[l.GetValue()] = m.GetGauge().GetValue()
				}
			}
		}
	}
	return out
}

// scorer_pool_devices counts the engines the pool runs on by kind, both
// kinds always present once the pool has a device, so an alert can compare
// cuda with 0; scorer_pool_device_mode says what DEVICE asked for. A pool
// that auto mode put on the CPU from its start must read cuda=0, cpu=1 with
// mode auto: that is the pod ScorerGPUFallback must catch.
func TestPoolDevicesGauge(t *testing.T) {
	noGPU := newFakeProbe()
	noGPU.err = fmt.Errorf("fake: no NVML: %w", ErrNoGPU)
	for _, tc := range []struct {
		name      string
		opts      []Option
		wantDevs  map[string]float64
		wantModes map[string]float64
	}{
		{"cpu mode", []Option{Mode(ModeCPU)}, map[string]float64{"cuda": 0, "cpu": 1}, map[string]float64{"cpu": 1}},
		{"auto mode without a GPU", []Option{Mode(ModeAuto), WithProbe(noGPU)}, map[string]float64{"cuda": 0, "cpu": 1}, map[string]float64{"auto": 1}},
		{"cuda mode, two GPUs", gpuOpts(newFakeProbe(&fakeGPU{total: 80 << 30}, &fakeGPU{total: 80 << 30})),
			map[string]float64{"cuda": 2, "cpu": 0}, map[string]float64{"cuda": 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			p := newPool(t, newFakeFactory(nil), append(tc.opts, Registerer(reg))...)
			mustScore(t, p, makePairs([]int{4, 8}))
			if got := gathered(t, reg, "scorer_pool_devices", "kind"); !maps.Equal(got, tc.wantDevs) {
				t.Errorf("scorer_pool_devices = %v, want %v", got, tc.wantDevs)
			}
			if got := gathered(t, reg, "scorer_pool_device_mode", "mode"); !maps.Equal(got, tc.wantModes) {
				t.Errorf("scorer_pool_device_mode = %v, want %v", got, tc.wantModes)
			}
		})
	}

	// A CPU engine created lazily, once the only GPU failed, counts too.
	t.Run("lazy CPU fallback", func(t *testing.T) {
		reg := prometheus.NewRegistry()
		f := newFakeFactory(map[string]*fakeEngine{"cuda:0": {err: errFakeCUDA}})
		p := newPool(t, f, gpuOpts(newFakeProbe(&fakeGPU{total: 80 << 30}), Mode(ModeAuto), Registerer(reg), withMaxDeviceFailures(2))...)
		if got, want := gathered(t, reg, "scorer_pool_devices", "kind"), map[string]float64{"cuda": 1, "cpu": 0}; !maps.Equal(got, want) {
			t.Errorf("before the fallback: scorer_pool_devices = %v, want %v", got, want)
		}
		mustScore(t, p, makePairs(realisticLengths(50, 3)))
		if p.Stats().Fallbacks != 1 {
			t.Fatalf("stats %+v: want one fallback", p.Stats())
		}
		if got, want := gathered(t, reg, "scorer_pool_devices", "kind"), map[string]float64{"cuda": 1, "cpu": 1}; !maps.Equal(got, want) {
			t.Errorf("after the fallback: scorer_pool_devices = %v, want %v", got, want)
		}
	})

	// Until a device is open there is no series: a pool still calibrating
	// its GPUs must not read as "cuda=0".
	t.Run("no series before a device", func(t *testing.T) {
		reg := prometheus.NewRegistry()
		p := newFakeProbe()
		p.err = errors.New("fake: NVML broken")
		if _, err := New(testCtx(t), newFakeFactory(nil).factory, Mode(ModeCUDA), WithProbe(p), Registerer(reg)); err == nil {
			t.Fatal("cuda mode without a GPU started")
		}
		if got := gathered(t, reg, "scorer_pool_devices", "kind"); len(got) != 0 {
			t.Errorf("a pool that opened no device exports scorer_pool_devices = %v", got)
		}
	})
}
