package doctor

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
)

// WriteJSON writes the report as one indented JSON document.
func WriteJSON(w io.Writer, r Report) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false) // causes and remedies say ">= 580"; keep them readable
	if err := enc.Encode(r); err != nil {
		return fmt.Errorf("doctor: writing JSON: %w", err)
	}
	return nil
}

// WriteText writes the report for a person: one labelled line per finding,
// a cause and a remedy under each problem. docs/gpu.md explains each line.
func WriteText(w io.Writer, r Report) error {
	var b strings.Builder
	line := func(key, format string, args ...any) {
		fmt.Fprintf(&b, "%-14s %s\n", key, fmt.Sprintf(format, args...))
	}
	problem := func(p *Problem) {
		if p == nil {
			return
		}
		if p.Remedy != "" {
			line("", "remedy: %s", p.Remedy)
		}
	}
	line("onnxruntime", "%s at %s", r.ORT.Version, r.ORT.Library)
	line("providers", "%s", strings.Join(r.ORT.Providers, ", "))
	if r.ORT.CUDA == nil {
		line("cuda provider", "loads (provider libraries, CUDA runtime and driver found)")
	} else {
		line("cuda provider", "unusable: %s", r.ORT.CUDA.Cause)
		problem(r.ORT.CUDA)
	}
	for _, l := range r.CUDALibs {
		if l.Path != "" {
			line("cuda library", "%s at %s (%s)", l.Name, l.Path, l.From)
		} else {
			line("cuda library", "%s not found", l.Name)
		}
	}
	if r.SignalsRestored > 0 {
		line("signals", "CUDA replaced %d signal handlers; restored Go's", r.SignalsRestored)
	}
	n := r.NVML
	switch {
	case r.Device == "cpu":
		line("nvml", "not checked (DEVICE=cpu)")
	case !n.Available:
		cause := "not checked"
		if n.Problem != nil {
			cause = n.Problem.Cause
		}
		line("nvml", "unavailable: %s", cause)
		problem(n.Problem)
	default:
		line("nvml", "driver %s, CUDA %d.%d supported", n.DriverVersion, n.CUDADriverVersion/1000, n.CUDADriverVersion%1000/10)
	}
	if r.Device != "cpu" {
		line("cuda env", "CUDA_VISIBLE_DEVICES=%s CUDA_DEVICE_ORDER=%s", n.CUDAVisibleDevices, n.CUDADeviceOrder)
	}
	for _, g := range n.GPUs {
		mig := ""
		if g.MIG {
			mig = " (MIG instance)"
		}
		line(fmt.Sprintf("gpu cuda:%d", g.CUDAIndex), "NVML %d, %s, %s, %.1f GiB, PCI %s%s", g.NVMLIndex, g.Name, g.UUID,
			float64(g.TotalMemory)/(1<<30), g.PCIBusID, mig)
	}
	if n.Available && len(n.GPUs) == 0 && n.Problem != nil {
		line("gpus", "none usable: %s", n.Problem.Cause)
		problem(n.Problem)
	}
	for _, wmsg := range n.Warnings {
		line("warning", "%s", wmsg)
	}
	if r.CPU != nil {
		writeCheck(line, problem, *r.CPU)
	}
	for _, g := range r.GPUs {
		writeCheck(line, problem, g)
	}
	line("sample", "%d pairs (%s encoding), decisions at THRESHOLD %.2f", r.Sample.Pairs, r.Sample.PairEncoding, r.Sample.Threshold)
	rec := r.Recommend
	settings := fmt.Sprintf("DEVICE=%s MAX_BATCH_TOKENS=%d WORKERS=%d", rec.Device, rec.MaxBatchTokens, rec.Workers)
	if rec.CPUThreads > 0 {
		settings += fmt.Sprintf(" CPU_THREADS=%d", rec.CPUThreads)
	}
	settings += " GPU_MEM_LIMIT=" + rec.GPUMemLimit
	line("recommend", "%s", settings)
	if rec.Note != "" {
		line("", "%s", rec.Note)
	}
	for _, s := range r.Skipped {
		line("skipped", "%s", s)
	}
	line("took", "%.1f s (budget %.0f s: --budget)", r.Seconds, r.Budget)
	line("path", "%s", r.Path)
	line("verdict", "%s", r.Verdict)
	if !r.OK && r.Problem != nil {
		problem(r.Problem)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func writeCheck(line func(string, string, ...any), problem func(*Problem), c DeviceCheck) {
	key := c.Device
	if c.Skipped != "" {
		line(key, "not checked: %s", c.Skipped)
		return
	}
	if !c.OK {
		cause := "failed"
		if c.Problem != nil {
			cause = c.Problem.Cause
		}
		line(key, "session FAILED: %s", cause)
		problem(c.Problem)
		return
	}
	if c.Batches == 0 {
		line(key, "session ok; %d sample pairs scored; throughput not measured (see skipped)", c.SamplePairs)
	} else {
		line(key, "session ok; %.0f pairs/s, %.1f pairs per batch, padding efficiency %.2f", c.PairsPerSecond, c.MeanBatchRows, c.Padding)
	}
	if c.MaxAbsDelta != nil && c.Agreement != nil {
		tf32 := ""
		if c.TF32MaxAbsDelta != nil {
			tf32 = fmt.Sprintf("; with TF32 toggled max |Δp| %.2g", *c.TF32MaxAbsDelta)
		}
		line("", "parity vs CPU: max |Δp| %.2g, decisions agree %.1f%%%s", *c.MaxAbsDelta, 100**c.Agreement, tf32)
	}
	if m := c.Memory; m != nil {
		beside := "the floor, not measured"
		if m.BesideArenaMeasured {
			beside = "measured"
		}
		line("", "memory: %.0f MiB + %.2f MiB·rows + %.1f KiB·rows·len + %.1f B·rows·len² (held-out error %.1f%%); weights %.0f MiB, CUDA beside the arena %.0f MiB (%s); arena cap %.1f GiB; %d rows fit at the model's max length",
			m.BaseBytes/(1<<20), m.PerRowBytes/(1<<20), m.PerTokenBytes/1024, m.PerTokenLenBytes, 100*m.HeldOutError,
			float64(m.WeightBytes)/(1<<20), m.BesideArenaBytes/(1<<20), beside, float64(m.ArenaLimitBytes)/(1<<30), m.MaxRowsAtModelMax)
	}
}
