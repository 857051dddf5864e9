package doctor

import (
	"errors"
	"fmt"
	"math"
	"runtime"

	"github.com/scorer/scorer/gpupool"
	"github.com/scorer/scorer/internal/config"
	"github.com/scorer/scorer/internal/measure"
	"github.com/scorer/scorer/model"
	"github.com/scorer/scorer/model/ortenv"
)

// parity compares a GPU's sample scores (and its TF32 alternative's) with
// the CPU's, over the pairs both scored.
func parity(c *DeviceCheck, cpu []float32, threshold float64) {
	n := min(len(c.scores), len(cpu))
	if !c.OK || n == 0 {
		return
	}
	delta, agree := compare(c.scores[:n], cpu[:n], threshold)
	c.MaxAbsDelta, c.Agreement = &delta, &agree
	if m := min(n, len(c.tf32Scores)); m > 0 {
		d, _ := compare(c.tf32Scores[:m], cpu[:m], threshold)
		c.TF32MaxAbsDelta = &d
	}
}

// compare returns the largest |a−b| and the share of pairs on the same
// side of threshold.
func compare(a, b []float32, threshold float64) (maxDelta, agreement float64) {
	t := measure.Tally{Threshold: threshold}
	t.AddAll(a, b)
	return t.MaxAbsDiff, t.Agreement()
}

// recommend suggests settings from what ran.
func recommend(m *model.Model, o Options, rep *Report) {
	r := &rep.Recommend
	r.MaxBatchTokens = o.Config.MaxBatchTokens
	r.GPUMemLimit = o.Config.SessionConfig(config.DetectHost()).GPUMemBudget.String()
	var best *DeviceCheck
	for i := range rep.GPUs {
		if rep.GPUs[i].OK && (best == nil || rep.GPUs[i].PairsPerSecond > best.PairsPerSecond) {
			best = &rep.GPUs[i]
		}
	}
	if best == nil {
		n := runtime.GOMAXPROCS(0)
		r.Device = "cpu"
		r.Workers = min(n, 4)
		r.CPUThreads = max(1, n/r.Workers)
		r.Note = "no usable GPU: DEVICE=cpu skips the GPU probe at start; WORKERS × CPU_THREADS = the cores this process may use"
		if m.OutputType == ortenv.Float16 {
			// Production-size DeBERTa-v3 in fp16: ~0.6 s a pair and ~9 s to
			// open on 2 cores, through the casts ORT puts around each op.
			r.Note += "; this is an fp16 graph, which the CPU runs through casts at a fraction of fp32's speed: on CPU hosts use the fp32 or int8 graph (MODEL_FILE)"
		}
		return
	}
	r.Device = "cuda"
	r.Workers = 2
	if mm := best.Memory; mm != nil && mm.MaxRowsAtModelMax > 0 {
		// The token budget should let a batch of the longest pairs fill the
		// memory the model leaves, no more (the planner caps rows anyway).
		tokens := mm.MaxRowsAtModelMax * m.MaxLength
		r.MaxBatchTokens = max(1024, min(65536, 1<<int(math.Floor(math.Log2(float64(tokens))))))
	}
	r.Note = "DEVICE=cuda fails loudly if the GPU goes missing; GPU_MEM_LIMIT: leave 0 alone on a GPU, else give each scorer its share (e.g. 0.4 for two)"
}

// verdict decides OK for the configured DEVICE and writes the one line.
func verdict(o Options, rep *Report, gpuProblem *Problem) {
	cpuOK := rep.CPU != nil && rep.CPU.OK
	gpuOK := false
	for _, g := range rep.GPUs {
		gpuOK = gpuOK || g.OK
	}
	switch {
	case o.device() == gpupool.ModeCPU:
		rep.Path, rep.OK = "cpu", cpuOK
		if !cpuOK {
			rep.Problem = rep.CPU.Problem
		}
	case gpuOK:
		rep.Path, rep.OK = "cuda", true
	case o.device() == gpupool.ModeCUDA:
		rep.Path, rep.OK, rep.Problem = "none", false, gpuProblem
	default: // auto without a GPU: the CPU path, with the reason
		rep.Path, rep.OK, rep.Problem = "cpu", cpuOK, gpuProblem
		if !cpuOK {
			rep.Problem = rep.CPU.Problem
		}
	}
	if rep.Problem == nil && !rep.OK {
		rep.Problem = &Problem{Cause: "unknown"}
	}
	switch {
	case rep.OK && rep.Path == "cuda":
		rep.Verdict = fmt.Sprintf("OK: DEVICE=%s scores on the GPU here", o.device())
	case rep.OK && o.device() == gpupool.ModeAuto:
		rep.Verdict = "OK: DEVICE=auto scores on the CPU here (no usable GPU: " + rep.Problem.Cause + ")"
	case rep.OK:
		rep.Verdict = "OK: DEVICE=cpu scores on the CPU here"
	default:
		rep.Verdict = fmt.Sprintf("FAIL: DEVICE=%s cannot work here: %s", o.device(), rep.Problem.Cause)
	}
}

// ErrNotOK is what a caller returns when the report's verdict is not OK,
// so the process exits non-zero with the cause.
var ErrNotOK = errors.New("doctor: the configured DEVICE cannot work on this host")
