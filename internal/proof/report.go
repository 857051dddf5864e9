package proof

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/scorer/scorer/gpupool"
	"github.com/scorer/scorer/internal/cli"
	"github.com/scorer/scorer/internal/compare"
	"github.com/scorer/scorer/internal/config"
	"github.com/scorer/scorer/internal/doctor"
)

// Target is the aim for deberta-v3-large in fp16 on one H100 with
// ONNX Runtime's CUDA provider: ~48-token pairs, wide length-sorted batches
// (scaled from MLPerf's BERT-large H100 figures by FLOPs per token).
var Target = struct{ Low, High float64 }{6000, 10000}

// Report is `make gpu-proof`'s result; JSON names are stable.
type Report struct {
	Date    string         `json:"date"`
	Host    string         `json:"host"`
	Doctor  *doctor.Report `json:"doctor,omitempty"`
	Parity  []Parity       `json:"parity"`
	Benches []Bench        `json:"benches"`
	Shares  []Share        `json:"shares"`
	// Findings are the conclusions, one line each, in the order docs/gpu.md
	// explains them.
	Findings []string `json:"findings"`
}

// Parity is one `scorer compare` run of the proof.
type Parity struct {
	Name string `json:"name"`
	compare.Report
}

// reportFlags are `scorer gpu-proof report`'s flags.
type reportFlags struct{ dir, outJSON, outMD string }

func (f *reportFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.dir, "dir", "", "results folder: doctor.json, compare-*.json, bench-*.json, share-*.json (required)")
	fs.StringVar(&f.outJSON, "json", "", "report JSON (default DIR/gpu-proof.json)")
	fs.StringVar(&f.outMD, "md", "", "report Markdown (default DIR/gpu-proof.md)")
}

func reportCommand(e cli.Env, args []string) error {
	fs := reportSpec.FlagSet(e)
	var f reportFlags
	f.register(fs)
	if err := reportSpec.Parse(fs, args); err != nil {
		return err
	}
	if f.dir == "" {
		return cli.UsageError{Msg: "gpu-proof report: --dir is required"}
	}
	r, err := Collect(f.dir)
	if err != nil {
		return err
	}
	if f.outJSON == "" {
		f.outJSON = filepath.Join(f.dir, "gpu-proof.json")
	}
	if f.outMD == "" {
		f.outMD = filepath.Join(f.dir, "gpu-proof.md")
	}
	if err := writeJSON(f.outJSON, r); err != nil {
		return err
	}
	if err := os.WriteFile(f.outMD, []byte(r.Markdown()), 0o644); err != nil {
		return fmt.Errorf("gpu-proof: %w", err)
	}
	fmt.Fprint(e.Stdout, r.Markdown())
	return nil
}

// Collect reads a results folder and draws the findings.
func Collect(dir string) (Report, error) {
	host, _ := os.Hostname()
	r := Report{Date: time.Now().UTC().Format(time.RFC3339), Host: host}
	read := func(path string, v any) error {
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if err := json.Unmarshal(data, v); err != nil {
			return fmt.Errorf("gpu-proof: %s: %w", path, err)
		}
		return nil
	}
	var d doctor.Report
	if err := read(filepath.Join(dir, "doctor.json"), &d); err == nil {
		r.Doctor = &d
	} else if !os.IsNotExist(err) {
		return r, err
	}
	glob := func(pattern string, each func(path, name string) error) error {
		files, _ := filepath.Glob(filepath.Join(dir, pattern))
		slices.Sort(files)
		for _, f := range files {
			name := strings.TrimSuffix(strings.TrimPrefix(filepath.Base(f), strings.SplitN(pattern, "*", 2)[0]), ".json")
			if err := each(f, name); err != nil {
				return err
			}
		}
		return nil
	}
	err := glob("compare-*.json", func(p, name string) error {
		var c compare.Report
		if err := read(p, &c); err != nil {
			return err
		}
		r.Parity = append(r.Parity, Parity{Name: name, Report: c})
		return nil
	})
	if err == nil {
		err = glob("bench-*.json", func(p, _ string) error {
			var b Bench
			if err := read(p, &b); err != nil {
				return err
			}
			r.Benches = append(r.Benches, b)
			return nil
		})
	}
	if err == nil {
		err = glob("share-*.json", func(p, _ string) error {
			var s Share
			if err := read(p, &s); err != nil {
				return err
			}
			r.Shares = append(r.Shares, s)
			return nil
		})
	}
	if err != nil {
		return r, err
	}
	r.Findings = r.findings()
	return r, nil
}

// best is a bench's fastest shape at pair lengths up to maxLen.
func (b Bench) best(maxLen int) (Shape, bool) {
	var out Shape
	ok := false
	for _, s := range b.Shapes {
		if s.Error == "" && s.Len <= maxLen && s.PairsPerSecond > out.PairsPerSecond {
			out, ok = s, true
		}
	}
	return out, ok
}

func (r Report) findings() []string {
	var f []string
	if d := r.Doctor; d != nil {
		f = append(f, "doctor: "+d.Verdict)
	}
	for _, p := range r.Parity {
		verdict := "PASS"
		if !p.Pass {
			verdict = "FAIL"
		}
		f = append(f, fmt.Sprintf("parity %s: %s, %d pairs, max |Δp| %.2g, decisions agree %.4f (%s vs %s)",
			p.Name, verdict, p.Pairs, p.MaxAbsDiff, p.Agreement, p.A.Name, p.B.Name))
	}
	var fp16, fp32, tf32 *Bench
	for i := range r.Benches {
		b := &r.Benches[i]
		switch {
		case b.Precision == "fp16" && fp16 == nil:
			fp16 = b
		case b.Precision == "fp32" && b.TF32 && tf32 == nil:
			tf32 = b
		case b.Precision == "fp32" && !b.TF32 && fp32 == nil:
			fp32 = b
		}
	}
	if fp16 != nil {
		if s, ok := fp16.best(64); ok {
			where := "within"
			switch {
			case s.PairsPerSecond < Target.Low:
				where = fmt.Sprintf("%.0f%% of the low end of", 100*s.PairsPerSecond/Target.Low)
			case s.PairsPerSecond > Target.High:
				where = "above"
			}
			f = append(f, fmt.Sprintf("fp16 %s on %s: best %.0f pairs/s at %d×%d tokens, %s the %.0f–%.0f target; %.1f TFLOP/s = %.1f%% of the fp16 peak (%.0f TFLOP/s)",
				fp16.Model, fp16.GPU, s.PairsPerSecond, s.Rows, s.Len, where, Target.Low, Target.High, s.TFLOPS, 100*s.PeakShare, fp16.FP16PeakTFLOPS))
		}
	}
	if fp16 != nil && fp32 != nil {
		a, okA := fp16.best(64)
		b, okB := fp32.best(64)
		if okA && okB && b.PairsPerSecond > 0 {
			f = append(f, fmt.Sprintf("fp16 vs fp32 (TF32 off): %.2fx the pairs/s at up to 64 tokens", a.PairsPerSecond/b.PairsPerSecond))
		}
	}
	if tf32 != nil && fp32 != nil {
		a, okA := tf32.best(64)
		b, okB := fp32.best(64)
		var on, off *Parity
		for i := range r.Parity {
			switch r.Parity[i].Name {
			case "cpu-vs-cuda-fp32-tf32":
				on = &r.Parity[i]
			case "cpu-vs-cuda-fp32":
				off = &r.Parity[i]
			}
		}
		if okA && okB && b.PairsPerSecond > 0 {
			line := fmt.Sprintf("TF32: %.2fx the fp32 pairs/s", a.PairsPerSecond/b.PairsPerSecond)
			if on != nil && off != nil {
				line += fmt.Sprintf("; max |Δp| vs CPU %.2g with it, %.2g without; decisions agree %.4f / %.4f", on.MaxAbsDiff, off.MaxAbsDiff, on.Agreement, off.Agreement)
				if on.Agreement >= off.Agreement && on.MaxAbsDiff < 1e-3 {
					line += " → GPU_TF32=true (the default) costs no decision here"
				} else {
					line += " → set GPU_TF32=false here (TF32 moves decisions), or use fp16 for speed"
				}
			}
			f = append(f, line)
		}
	}
	for _, b := range r.Benches {
		label := b.Precision
		if b.TF32 {
			label += ", TF32"
		}
		margin := fmt.Sprintf("the %d MiB admission margin", b.MarginBytes>>20)
		verdict := "covers it"
		switch {
		case b.MarginMeasured:
			margin = fmt.Sprintf("the %d MiB admission counts there (measured after its workers ran)", b.MarginBytes>>20)
			if b.NonArenaBytes > int64(b.MarginBytes) {
				verdict = "does NOT cover it: the pool's measurement missed memory beside the arena"
			}
		case b.NonArenaBytes > int64(b.MarginBytes):
			verdict = fmt.Sprintf("does NOT cover it: raise gpupool.DefaultGPUMemMargin to ≥ %d MiB", (b.NonArenaBytes*5/4)>>20)
		}
		f = append(f, fmt.Sprintf("memory %s (%s): idle %.0f MiB = weights %.0f MiB + %.0f MiB CUDA context/workspaces; %s %s",
			b.Model, label, float64(b.IdleBytes)/(1<<20), float64(b.WeightBytes)/(1<<20), float64(b.NonArenaBytes)/(1<<20), margin, verdict))
		if c := b.Calibrated; c.Error == "" {
			b.compareMemory()
			under := "never under"
			if b.MaxUnder > 0 {
				under = fmt.Sprintf("UNDER by %.0f%% at %s: admission can over-commit the GPU", 100*b.MaxUnder, b.UnderAt)
			}
			f = append(f, fmt.Sprintf("calibration %s (%s): %.0f B + %.2f MiB·rows + %.0f B·rows·len + %.1f B·rows·len², held-out margin %.1f%%; predicted against measured activation peaks: largest error %.0f%%, %s",
				b.Model, label, c.Base, c.PerRow/(1<<20), c.PerToken, c.PerTokenLen, 100*c.HeldOut, 100*b.MaxRelError, under))
		} else {
			f = append(f, fmt.Sprintf("calibration %s (%s) failed: %s", b.Model, label, b.Calibrated.Error))
		}
	}
	if len(r.Shares) > 0 {
		ok := true
		var peak, total uint64
		var pps float64
		for _, s := range r.Shares {
			ok = ok && s.Error == "" && s.OOMRetries == 0 && s.Fallbacks == 0
			peak, total = max(peak, s.DevicePeakUsed), max(total, s.DeviceTotal)
			pps += s.PairsPerSec
		}
		verdict := "no OOM, no CPU fallback"
		if !ok {
			verdict = "FAILED (OOM, fallback or error: see shares)"
		}
		f = append(f, fmt.Sprintf("sharing: %d scorers on one GPU: %s; device peak %.1f of %.1f GiB; %.0f pairs/s together on real transcripts",
			len(r.Shares), verdict, float64(peak)/(1<<30), float64(total)/(1<<30), pps))
	}
	return f
}

// Markdown is the report for a person, in docs/gpu.md's order.
func (r Report) Markdown() string {
	var b strings.Builder
	fmt.Fprintf(&b, "# GPU proof, %s (%s)\n\n", r.Date, r.Host)
	if d := r.Doctor; d != nil && len(d.NVML.GPUs) > 0 {
		g := d.NVML.GPUs[0]
		fmt.Fprintf(&b, "GPU: %s, %.0f GiB, driver %s (CUDA %d.%d); ONNX Runtime %s\n\n", g.Name, float64(g.TotalMemory)/(1<<30),
			d.NVML.DriverVersion, d.NVML.CUDADriverVersion/1000, d.NVML.CUDADriverVersion%1000/10, d.ORT.Version)
	}
	b.WriteString("## Findings\n\n")
	for _, f := range r.Findings {
		fmt.Fprintf(&b, "- %s\n", f)
	}
	if d := r.Doctor; d != nil && len(d.CUDALibs) > 0 {
		b.WriteString("\n## CUDA libraries\n\n| library | found at |\n|---|---|\n")
		for _, l := range d.CUDALibs {
			at := l.Path + " (" + l.From + ")"
			if l.Path == "" {
				at = "not found"
			}
			fmt.Fprintf(&b, "| %s | %s |\n", l.Name, at)
		}
	}
	for _, bn := range r.Benches {
		fmt.Fprintf(&b, "\n## %s, %s%s on %s\n\n", bn.Model, bn.Precision, map[bool]string{true: " (TF32)"}[bn.TF32], bn.GPU)
		b.WriteString("| rows × len | pairs/s | ms/batch | peak MiB | activations MiB | predicted MiB | TFLOP/s | fp16 peak | GPU busy |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|\n")
		for _, s := range bn.Shapes {
			if s.Error != "" {
				fmt.Fprintf(&b, "| %d × %d | %s | | | | | | | |\n", s.Rows, s.Len, firstWords(s.Error))
				continue
			}
			// Files from before issue 46 have no busy reading: a blank, not 0%.
			busy := ""
			if s.GPUBusy != nil {
				busy = fmt.Sprintf("%.0f%%", 100**s.GPUBusy)
			}
			fmt.Fprintf(&b, "| %d × %d | %.0f | %.1f | %.0f | %.0f | %.0f | %.1f | %.1f%% | %s |\n", s.Rows, s.Len, s.PairsPerSecond, s.MsPerBatch,
				float64(s.PeakBytes)/(1<<20), float64(s.ActivationBytes)/(1<<20), s.PredictedBytes/(1<<20), s.TFLOPS, 100*s.PeakShare, busy)
		}
	}
	if len(r.Shares) > 0 {
		b.WriteString("\n## Two scorers, one GPU\n\n| scorer | GPU_MEM_LIMIT | pairs | pairs/s | rows/batch | OOM retries | refusals | CPU fallbacks | error |\n|---|---|---:|---:|---:|---:|---:|---:|---|\n")
		for _, s := range r.Shares {
			fmt.Fprintf(&b, "| %s | %s | %d | %.0f | %.1f | %d | %d | %d | %s |\n", s.Name, s.GPUMemLimit, s.Pairs, s.PairsPerSec, s.MeanBatchRows,
				s.OOMRetries, s.Refusals, s.Fallbacks, s.Error)
		}
	}
	tf32, _ := reflect.TypeFor[config.Config]().FieldByName("GPUTF32")
	fmt.Fprintf(&b, "\nDefaults in this build: GPU_TF32=%s; admission counts %d MiB beside the weights and the arena until it has measured what CUDA takes there (gpupool.DefaultGPUMemMargin).\n",
		tf32.Tag.Get("envDefault"), gpupool.DefaultGPUMemMargin>>20)
	return b.String()
}

func firstWords(s string) string {
	s = strings.ReplaceAll(s, "|", "/")
	if len(s) > 80 {
		s = s[:80] + "…"
	}
	if strings.Contains(strings.ToLower(s), "memory") {
		return "OOM"
	}
	return s
}
