package scoring

import (
	"context"
	"sync"

	"github.com/rs/zerolog"

	"github.com/scorer/scorer/gpupool"
	"github.com/scorer/scorer/internal/config"
)

// Runtime is what every stack of one process shares and what must outlive
// them all: the ONNX Runtime environment and NVML. Open starts one for its
// stack and closes it with the stack; a command that opens several stacks
// (bench, compare, doctor, gpu-proof) starts one with StartRuntime, passes it
// to each Open (OnRuntime) and closes it after the last stack.
//
// Its Close keeps the one rule of shutting down a scorer: once a pool did
// not finish closing (gpupool.ErrCloseIncomplete, or any error from its
// Close), a run or an NVML call may still be going, so NVML and ONNX
// Runtime stay loaded (unloading them under a live call crashes the
// process, which is exiting anyway). Every stack's Close tells its Runtime.
//
// A Runtime is safe for concurrent use.
type Runtime struct {
	log      zerolog.Logger
	closeORT func() error

	mu        sync.Mutex
	nvmlTried bool
	probe     gpupool.Probe // nil until NVML opened, or when it could not be
	nvmlErr   error
	closeNVML func()
	// unfinished is set when a pool's Close failed (see above).
	unfinished bool
	closed     bool
}

// StartRuntime starts the process's one ONNX Runtime environment from
// ortLib (ORT_LIB, resolved as InitORT does). NVML is opened later, once:
// by the first Open whose DEVICE is not cpu, or by OpenNVML.
func StartRuntime(ortLib string, log zerolog.Logger) (*Runtime, error) {
	shutdown, err := InitORT(ortLib)
	if err != nil {
		return nil, err
	}
	return &Runtime{log: log, closeORT: shutdown}, nil
}

// OpenNVML opens NVML with lookup as the environment CUDA_VISIBLE_DEVICES
// is read from (nil: the process's), unless it is open already, and
// returns its probe, or why it cannot be opened (the doctor reports that;
// the stacks opened after it see the same probe or the same error). Close
// shuts NVML down.
func (rt *Runtime) OpenNVML(ctx context.Context, lookup func(string) (string, bool)) (gpupool.Probe, error) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if !rt.nvmlTried {
		rt.nvmlTried = true
		var opts []gpupool.NVMLOption
		if lookup != nil {
			opts = append(opts, gpupool.NVMLLookupEnv(lookup))
		}
		rt.probe, rt.closeNVML, rt.nvmlErr = gpupool.NewNVMLProbe(ctx, opts...)
	}
	return rt.probe, rt.nvmlErr
}

// probeFor is the probe a pool built from cfg uses: none for DEVICE=cpu;
// NVML, opened at the first call (after CUDA_DEVICE_ORDER is set, see
// PCIBusOrder); under DEVICE=auto, when NVML is unavailable,
// gpupool.UnavailableProbe with the reason, so the pool logs its CPU
// fallback once with it and does not open NVML a second time; an error
// naming the cause under DEVICE=cuda.
func (rt *Runtime) probeFor(ctx context.Context, cfg config.Config, log zerolog.Logger) (gpupool.Probe, error) {
	if cfg.Device == string(gpupool.ModeCPU) {
		return nil, nil
	}
	PCIBusOrder(log)
	// The CUDA runtime reads CUDA_VISIBLE_DEVICES from the real process
	// environment, so the probe must too, to number GPUs as CUDA does.
	probe, err := rt.OpenNVML(ctx, nil)
	if err != nil {
		return gpupool.UnavailableProbe(err), probeError(cfg, err, log)
	}
	return probe, nil
}

// poolUnfinished records that a pool did not finish closing: Close then
// leaves NVML and ONNX Runtime loaded.
func (rt *Runtime) poolUnfinished() {
	rt.mu.Lock()
	rt.unfinished = true
	rt.mu.Unlock()
}

// Close shuts NVML down, then ONNX Runtime, unless a pool of a stack on
// this Runtime did not finish closing; then both stay loaded (see
// Runtime). Call it after every stack on rt is closed; a second call does
// nothing.
func (rt *Runtime) Close() error {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if rt.closed {
		return nil
	}
	rt.closed = true
	if rt.unfinished {
		rt.log.Warn().Msg("leaving NVML initialised and ONNX Runtime loaded: a device pool did not finish closing (the process is exiting anyway)")
		return nil
	}
	if rt.closeNVML != nil {
		rt.closeNVML()
	}
	return rt.closeORT()
}
