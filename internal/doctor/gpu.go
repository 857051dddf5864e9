package doctor

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/scorer/scorer/gpupool"
	"github.com/scorer/scorer/internal/config"
	"github.com/scorer/scorer/internal/scoring"
	"github.com/scorer/scorer/model"
	"github.com/scorer/scorer/model/ortenv"
)

// cudnnWarning warns when the CUDA provider loads but cuDNN is missing:
// the provider opens cuDNN only when a run first needs it, so the GPU
// check passing does not clear it.
func cudnnWarning(rep *Report) {
	if rep.ORT.CUDA != nil {
		return // the provider's own problem is the cause shown
	}
	for _, l := range rep.CUDALibs {
		if strings.HasPrefix(l.Name, "libcudnn") && l.Path == "" {
			rep.NVML.Warnings = append(rep.NVML.Warnings, fmt.Sprintf("%s not found (%s): the CUDA provider opens cuDNN at the first run that needs it; "+
				"install cuDNN 9 for CUDA 13 (the CUDA image, or pip's nvidia-cudnn-cu13 through the bundle's launcher)", l.Name, l.Error))
		}
	}
}

// checkGPUs reads NVML and runs every selected GPU; it returns why no GPU
// works, or nil when at least one does.
func checkGPUs(ctx context.Context, rt *scoring.Runtime, m *model.Model, o Options, pairs []model.Pair, b *budget, rep *Report) *Problem {
	n := &rep.NVML
	n.CUDAVisibleDevices, n.CUDADeviceOrder = envOr(o.LookupEnv, "CUDA_VISIBLE_DEVICES"), envOr(o.LookupEnv, "CUDA_DEVICE_ORDER")
	probe, err := rt.OpenNVML(ctx, o.LookupEnv)
	if err != nil {
		n.Problem = problemOf(err)
		return n.Problem
	}
	n.Available = true
	if sr, ok := probe.(gpupool.SystemReporter); ok {
		if si, err := sr.System(); err == nil {
			n.DriverVersion, n.CUDADriverVersion = si.DriverVersion, si.CUDADriverVersion
		}
	}
	devs, err := probe.Devices()
	if r, ok := probe.(gpupool.DeviceReporter); ok {
		for _, w := range r.DeviceWarnings() {
			n.Warnings = append(n.Warnings, w.Error())
		}
	}
	if err != nil {
		n.Problem = problemOf(err)
		return n.Problem
	}
	for _, d := range devs {
		n.GPUs = append(n.GPUs, GPUInfo{CUDAIndex: d.Index, NVMLIndex: d.NVMLIndex, UUID: d.UUID, Name: d.Name,
			TotalMemory: d.TotalMemory, PCIBusID: d.PCIBusID, MIG: d.MIG})
	}
	if rep.ORT.CUDA != nil {
		// NVML sees GPUs, but ORT cannot drive them: that is the cause.
		return rep.ORT.CUDA
	}
	var first *Problem
	for _, d := range devs {
		if ids := o.Config.GPUIDs; len(ids) > 0 && !selected(ids, d) {
			continue
		}
		c := checkGPU(ctx, rt, m, o, d, pairs, b)
		rep.GPUs = append(rep.GPUs, c)
		if !c.OK && first == nil {
			first = c.Problem
		}
	}
	for _, c := range rep.GPUs {
		if c.OK {
			return nil
		}
	}
	if first == nil {
		first = &Problem{Cause: fmt.Sprintf("GPU_IDS %v selects none of the %d GPUs", o.Config.GPUIDs, len(devs)),
			Remedy: "fix GPU_IDS (CUDA indexes or UUIDs, as listed above)"}
	}
	return first
}

func selected(ids []string, d gpupool.DeviceInfo) bool {
	for _, id := range ids {
		id = strings.TrimSpace(id)
		if id == fmt.Sprint(d.Index) || strings.EqualFold(id, d.UUID) {
			return true
		}
	}
	return false
}

func envOr(lookup func(string) (string, bool), k string) string {
	if v, ok := lookup(k); ok {
		return v
	}
	return "(unset)"
}

// checkGPU opens a calibrated one-GPU pool exactly as the service would,
// scores the sample for parity with the CPU (compared once the CPU has
// run), scores it with TF32 toggled where that changes anything and the
// budget allows, and runs the throughput check.
func checkGPU(ctx context.Context, rt *scoring.Runtime, m *model.Model, o Options, d gpupool.DeviceInfo, pairs []model.Pair, b *budget) DeviceCheck {
	opened := time.Now()
	dev := gpupool.Device{Kind: gpupool.CUDA, Index: d.Index, UUID: d.UUID, Name: d.Name, TotalMemory: d.TotalMemory}
	c := DeviceCheck{Device: dev.Label(), UUID: d.UUID}
	// The service's pool on this one GPU, without the CPU to fall back to,
	// on the Runtime's NVML.
	stack, err := scoring.Open(ctx, o.Config, o.Log, nil, scoring.OnRuntime(rt), scoring.WithModel(m), scoring.OneGPU(d.UUID), scoring.NoCache())
	if err != nil {
		c.Problem = problemOf(err)
		return c
	}
	c.opening = time.Since(opened)
	defer stack.Close(context.Background())
	pool := stack.Pool
	scfg := o.Config.SessionConfig(config.DetectHost())
	c.MaxBatchTokens, c.MaxBatchRows = pool.BatchShape()
	st := pool.Stats().Devices[0]
	c.Workers = st.Workers
	// The pool's own memory model: the budget it admits against and the
	// room it cuts batches to (headroom included), not a recomputation.
	mm := st.Memory
	c.Memory = &MemoryModel{BaseBytes: mm.Base, PerRowBytes: mm.PerRow, PerTokenBytes: mm.PerToken,
		PerTokenLenBytes: mm.PerTokenLen, HeldOutError: mm.HeldOut, WeightBytes: mm.WeightBytes,
		BesideArenaBytes: mm.BesideArenaBytes, BesideArenaMeasured: mm.BesideArenaMeasured, ArenaLimitBytes: gpupool.ArenaLimit(dev, scfg),
		MaxRowsAtModelMax: mm.MaxRows(m.MaxLength, mm.Room(mm.BudgetBytes))}
	// The GPU's share: the CPU reference still has to run after it.
	share := func() time.Duration { return b.left() / 2 }
	scores, perPair, err := scoreSample(ctx, pool.ScorePairs, pairs, chunkPairs(o), share)
	if err != nil {
		c.Problem = problemOf(err)
		return c
	}
	c.OK, c.scores, c.SamplePairs = true, scores, len(scores)
	if len(scores) < len(pairs) {
		b.skip("%s: scored %d of the sample's %d pairs (the budget)", c.Device, len(scores), len(pairs))
	}
	switch took := time.Since(opened); {
	case m.OutputType == ortenv.Float16:
		b.skip("%s: TF32 comparison skipped: an fp16 graph has no float32 products for TF32 to change", c.Device)
	case took > share():
		// Another session costs about what this one did to open and run.
		b.skip("%s: TF32 comparison skipped: a second session would take about %.1f s, the budget has %.1f s", c.Device,
			took.Seconds(), max(0, b.left().Seconds()))
	default:
		alt := scfg
		alt.TF32 = !scfg.TF32
		if eng, err := gpupool.SessionFactory(m, alt)(dev); err == nil {
			// The configured run is the one reported as parity; the other
			// setting's delta is what toggling TF32 would give.
			c.tf32Scores, _ = eng.ScorePairs(ctx, pairs[:len(scores)])
			_ = eng.Close()
		}
	}
	throughput(ctx, pool, pairs, chunkPairs(o), min(o.Duration, share()), perPair, b, &c)
	return c
}
