package config

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/scorer/scorer/gpupool"
	"github.com/scorer/scorer/model"
)

// TestDeviceCUDAIsGPUsOnly: the pool PoolOptions builds for DEVICE=cuda
// opens no CPU engine when its GPU, healthy at start, fails every batch
// afterwards: the call fails (the GPU path's error) instead of running on
// an engine with no memory budget and the GPU's batch shape. DEVICE=auto
// still falls back to the CPU.
func TestDeviceCUDAIsGPUsOnly(t *testing.T) {
	for device, wantCPU := range map[string]bool{"cuda": false, "auto": true} {
		t.Run(device, func(t *testing.T) {
			cfg, err := parseConfig(t, map[string]string{"DEVICE": device, "GPU_CALIBRATION_CACHE": "off", "CPU_CALIBRATION_CACHE": "off"})
			if err != nil {
				t.Fatal(err)
			}
			opts, err := cfg.PoolOptions(Host{Cores: 2})
			if err != nil {
				t.Fatal(err)
			}
			gpu := &breakingGPU{}
			var cpuOpens atomic.Int32
			factory := func(d gpupool.Device) (gpupool.Engine, error) {
				if d.Kind == gpupool.CPU {
					cpuOpens.Add(1)
					return okEngine{}, nil
				}
				return gpu, nil
			}
			pool, err := gpupool.New(t.Context(), factory, append(opts, gpupool.WithProbe(gpu))...)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = pool.Close(context.Background()) }()
			gpu.broken.Store(true)
			pairs := []model.Pair{{IDs: []int32{1, 2, 3}}, {IDs: []int32{1, 2, 3, 4}}}
			_, err = pool.ScorePairs(t.Context(), pairs)
			if n := cpuOpens.Load(); (n > 0) != wantCPU {
				t.Errorf("DEVICE=%s: %d CPU engines opened, want a CPU engine: %v", device, n, wantCPU)
			}
			if wantCPU == (err != nil) {
				t.Errorf("DEVICE=%s: ScorePairs err = %v", device, err)
			}
			if !wantCPU && (err == nil || !strings.Contains(err.Error(), "no device can run")) {
				t.Errorf("DEVICE=%s: err = %v, want the GPU path's no-device error", device, err)
			}
		})
	}
}

// breakingGPU is one fake GPU and its engine: calibration passes, and
// once broken every run fails as a lost device's would.
type breakingGPU struct {
	mu     sync.Mutex
	used   uint64
	broken atomic.Bool
}

func (g *breakingGPU) ScorePairs(_ context.Context, pairs []model.Pair) ([]float32, error) {
	if g.broken.Load() {
		return nil, errors.New("fake: CUDA failure: an illegal memory access was encountered")
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	l := uint64(pairs[0].Len())
	g.used = max(g.used, uint64(len(pairs))*l*(64<<10+64*l))
	return make([]float32, len(pairs)), nil
}
func (*breakingGPU) Close() error   { return nil }
func (*breakingGPU) MaxLength() int { return 512 }
func (g *breakingGPU) Devices() ([]gpupool.DeviceInfo, error) {
	return []gpupool.DeviceInfo{{UUID: "GPU-test", Name: "Test GPU", TotalMemory: 80 << 30}}, nil
}
func (g *breakingGPU) MemoryInfo(int) (free, used, total uint64, err error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return 80<<30 - g.used, g.used, 80 << 30, nil
}
func (*breakingGPU) Utilization(int) (uint32, error) { return 0, nil }
func (*breakingGPU) Throttled(int) (uint64, error)   { return 0, nil }

// okEngine scores every pair 0.
type okEngine struct{}

func (okEngine) ScorePairs(_ context.Context, pairs []model.Pair) ([]float32, error) {
	return make([]float32, len(pairs)), nil
}
func (okEngine) Close() error { return nil }
