package proof

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/rs/zerolog"

	"github.com/scorer/scorer/gpupool"
	"github.com/scorer/scorer/internal/config"
	"github.com/scorer/scorer/internal/scoring"
	"github.com/scorer/scorer/model"
)

// open starts ONNX Runtime, loads the configured model and opens NVML, in
// the Runtime every pool of the command is built on; its Close undoes them
// (unless a pool did not finish closing).
func open(ctx context.Context, cfg config.Config) (*model.Model, gpupool.Probe, *scoring.Runtime, error) {
	rt, err := scoring.StartRuntime(cfg.ORTLib, zerolog.Nop())
	if err != nil {
		return nil, nil, nil, err
	}
	m, err := scoring.LoadModel(cfg)
	if err != nil {
		_ = rt.Close()
		return nil, nil, nil, err
	}
	probe, err := rt.OpenNVML(ctx, os.LookupEnv)
	if err != nil {
		_ = rt.Close()
		return nil, nil, nil, fmt.Errorf("gpu-proof: %w (run `scorer doctor` for the cause)", err)
	}
	return m, probe, rt, nil
}

// memReader reads this process's device memory where NVML lists it, else
// the device's used memory, and says which in *kind.
func memReader(p gpupool.Probe, idx int, kind *string) func() uint64 {
	if r, ok := p.(gpupool.ProcessMemoryReader); ok {
		if _, err := r.ProcessMemory(idx); err == nil || errors.Is(err, gpupool.ErrProcessNotListed) {
			*kind = "process"
			return func() uint64 {
				n, err := r.ProcessMemory(idx)
				if err != nil {
					_, used, _, _ := p.MemoryInfo(idx)
					return used
				}
				return n
			}
		}
	}
	*kind = "device"
	return func() uint64 {
		_, used, _, _ := p.MemoryInfo(idx)
		return used
	}
}
