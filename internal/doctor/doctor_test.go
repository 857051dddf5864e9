package doctor

import (
	"bytes"
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/scorer/scorer/gpupool"
	"github.com/scorer/scorer/internal/config"
	"github.com/scorer/scorer/internal/testenv"
	"github.com/scorer/scorer/model"
	"github.com/scorer/scorer/model/ortenv"
)

// noGPUHere skips on a machine where NVML works: these tests pin down the
// report of a host without a GPU (this project's CI).
func noGPUHere(t *testing.T) {
	t.Helper()
	probe, shutdown, err := gpupool.NewNVMLProbe(t.Context())
	if err == nil {
		defer shutdown()
		if _, err := probe.Devices(); err == nil {
			t.Skip("this machine has a GPU; run `scorer doctor` to see its report")
		}
	}
}

func optionsFor(t *testing.T, device gpupool.DeviceMode, modelDir string) Options {
	cfg, err := config.FromEnv(func(k string) string {
		return map[string]string{"DEVICE": string(device), "MODEL_DIR": modelDir, "LABELS": "consumer strength,consumer weakness"}[k]
	})
	if err != nil {
		t.Fatal(err)
	}
	// The checks of what the report says get all the time they need (under
	// -race a pool can take longer to open than the default budget);
	// TestDoctorBudgetCutsAndSaysSo checks the cuts.
	return Options{Config: cfg, ORTLib: testenv.ORTLib(t), Duration: 100 * time.Millisecond, Budget: 10 * time.Minute}
}

// On a host without a GPU, the doctor runs the real model on the real
// library: auto (and cpu, on every model folder) pass on the CPU path and
// say why there is no GPU; cuda fails with the cause. The shipped core lists
// the CUDA provider, and without its provider files beside it the report
// names the missing file.
func TestDoctorWithoutGPU(t *testing.T) {
	noGPUHere(t)
	type testCase struct {
		device gpupool.DeviceMode
		dir    string
		ok     bool
		path   string
	}
	cases := []testCase{
		{gpupool.ModeAuto, testenv.ScorerModelDir(t), true, "cpu"},
		{gpupool.ModeCUDA, testenv.ScorerModelDir(t), false, "none"},
	}
	for _, dir := range testenv.ModelDirs(t) {
		if testing.Short() && filepath.Base(dir) != testenv.ProductionArch {
			continue
		}
		cases = append(cases, testCase{gpupool.ModeCPU, dir, true, "cpu"})
	}
	if testing.Short() {
		t.Log("-short: DEVICE=cpu on the production architecture only; make test runs it on every shared model")
	}
	for _, tc := range cases {
		t.Run(string(tc.device)+"/"+filepath.Base(tc.dir), func(t *testing.T) {
			rep, err := Run(t.Context(), optionsFor(t, tc.device, tc.dir))
			if err != nil {
				t.Fatal(err)
			}
			if rep.OK != tc.ok || rep.Path != tc.path {
				t.Fatalf("ok %v path %q (%s), want %v %q", rep.OK, rep.Path, rep.Verdict, tc.ok, tc.path)
			}
			if !slicesContain(rep.ORT.Providers, "CUDAExecutionProvider") || rep.ORT.Version == "" {
				t.Errorf("ORT report %+v: want the version and the CUDA provider listed", rep.ORT)
			}
			if p := rep.ORT.CUDA; p == nil || p.Kind != ortenv.ProblemProviderFiles || !strings.Contains(p.Cause, "libonnxruntime_providers_shared.so") {
				t.Errorf("CUDA provider problem %+v, want the missing provider file named", p)
			}
			// Every CUDA library is looked up (cuDNN included) and, on this
			// host without CUDA, reported missing by name.
			if tc.device != gpupool.ModeCPU {
				if len(rep.CUDALibs) != len(ortenv.CUDALibraries) {
					t.Errorf("CUDA libraries %+v, want each of %v", rep.CUDALibs, ortenv.CUDALibraries)
				}
				for _, l := range rep.CUDALibs {
					if l.Path != "" || !strings.Contains(l.Error, l.Name) {
						t.Errorf("%s: %+v, want not found, with the loader's message", l.Name, l)
					}
				}
			} else if rep.CUDALibs != nil {
				t.Errorf("DEVICE=cpu looked up CUDA libraries: %+v", rep.CUDALibs)
			}
			if rep.CPU == nil || !rep.CPU.OK || rep.CPU.PairsPerSecond <= 0 || rep.CPU.Batches == 0 || rep.Sample.Pairs != 24 {
				t.Errorf("CPU check %+v (sample %d pairs; skipped %q): want a working session with a throughput", rep.CPU, rep.Sample.Pairs, rep.Skipped)
			}
			// The service's CPU batch shape (CPU_MAX_BATCH_ROWS=16 caps
			// MAX_BATCH_ROWS=256), not the GPU's.
			if c := rep.CPU; c != nil && (c.MaxBatchRows != 16 || c.MeanBatchRows > 16 || c.Workers < 1 || c.IntraOpThreads < 1) {
				t.Errorf("CPU check ran %d-row batches (mean %.1f) on %d workers × %d threads, want the service's CPU shape of 16 rows", c.MaxBatchRows, c.MeanBatchRows, c.Workers, c.IntraOpThreads)
			}
			if tc.device != gpupool.ModeCPU {
				if rep.Problem == nil || rep.Problem.Kind != ortenv.ProblemNoDriver || rep.Problem.Remedy == "" {
					t.Errorf("problem %+v, want no_driver with a remedy", rep.Problem)
				}
				if !strings.Contains(rep.Verdict, rep.Problem.Cause) {
					t.Errorf("verdict %q does not give the cause", rep.Verdict)
				}
			}
			var text, js bytes.Buffer
			if err := WriteText(&text, rep); err != nil {
				t.Fatal(err)
			}
			wants := []string{"onnxruntime    " + rep.ORT.Version, "cuda provider  unusable", "verdict        " + rep.Verdict, "recommend      DEVICE=cpu"}
			if tc.device != gpupool.ModeCPU {
				wants = append(wants, "cuda library   libcudnn.so.9 not found")
			}
			for _, want := range wants {
				if !strings.Contains(text.String(), want) {
					t.Errorf("text report lacks %q:\n%s", want, text.String())
				}
			}
			if err := WriteJSON(&js, rep); err != nil {
				t.Fatal(err)
			}
			var back Report
			if err := json.Unmarshal(js.Bytes(), &back); err != nil || back.OK != rep.OK || back.Verdict != rep.Verdict || back.CPU.PairsPerSecond != rep.CPU.PairsPerSecond {
				t.Errorf("JSON round trip: %v\n%s", err, js.String())
			}
		})
	}
}

func slicesContain(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

func TestCompare(t *testing.T) {
	d, agree := compare([]float32{0.1, 0.95, 0.92, 0.5}, []float32{0.1, 0.96, 0.90, 0.5}, 0.91)
	if d < 0.0199 || d > 0.0201 || agree != 0.75 {
		t.Errorf("compare = %v, %v; want 0.02, 0.75", d, agree)
	}
}

// The GPU half of the report cannot run here; its arithmetic can. A working
// GPU makes the path cuda for auto and cuda alike, and the token budget is
// the power of two that lets the longest pairs fill the memory left.
func TestVerdictAndRecommendationWithGPU(t *testing.T) {
	delta, agree := 3e-5, 1.0
	gpu := DeviceCheck{Device: "cuda:0", OK: true, PairsPerSecond: 900, MaxAbsDelta: &delta, Agreement: &agree,
		Memory: &MemoryModel{MaxRowsAtModelMax: 40}}
	m := &model.Model{MaxLength: 512}
	for _, dev := range []gpupool.DeviceMode{gpupool.ModeAuto, gpupool.ModeCUDA} {
		rep := Report{CPU: &DeviceCheck{Device: "cpu", OK: true}, GPUs: []DeviceCheck{{Device: "cuda:1"}, gpu}}
		o := Options{Config: config.Config{Device: string(dev), MaxBatchTokens: 16384, GPUMemLimit: "0"}}
		recommend(m, o, &rep)
		verdict(o, &rep, nil)
		if !rep.OK || rep.Path != "cuda" || !strings.HasPrefix(rep.Verdict, "OK") {
			t.Errorf("DEVICE=%s: ok %v path %s verdict %q", dev, rep.OK, rep.Path, rep.Verdict)
		}
		// 40 rows × 512 = 20480 tokens: the power of two below is 16384.
		if r := rep.Recommend; r.Device != "cuda" || r.Workers != 2 || r.MaxBatchTokens != 16384 || r.GPUMemLimit != "0" {
			t.Errorf("DEVICE=%s: recommend %+v", dev, r)
		}
		var text bytes.Buffer
		if err := WriteText(&text, rep); err != nil || !strings.Contains(text.String(), "parity vs CPU: max |Δp| 3e-05, decisions agree 100.0%") {
			t.Errorf("text report:\n%s", text.String())
		}
	}
	// DEVICE=cpu ignores the GPU: the verdict is about the configured path.
	rep := Report{CPU: &DeviceCheck{Device: "cpu", OK: true}}
	verdict(Options{Config: config.Config{Device: "cpu"}}, &rep, nil)
	if !rep.OK || rep.Path != "cpu" {
		t.Errorf("DEVICE=cpu: %+v", rep)
	}
}

// The budget bounds everything past proving the path works: with none
// left, the doctor still opens the configured CPU pool and scores the
// sample's first pair on the real model, then
// skips the rest of the sample and the throughput run, and says so in both
// reports; the verdict stays OK. The CPU as a GPU's parity reference is not
// even opened when less is left than a GPU's pool took to open.
func TestDoctorBudgetCutsAndSaysSo(t *testing.T) {
	noGPUHere(t)
	o := optionsFor(t, gpupool.ModeAuto, testenv.ScorerModelDir(t))
	o.Budget = time.Nanosecond
	rep, err := Run(t.Context(), o)
	if err != nil {
		t.Fatal(err)
	}
	if !rep.OK || rep.CPU == nil || !rep.CPU.OK || rep.CPU.SamplePairs != 1 || rep.CPU.Batches != 0 {
		t.Fatalf("ok %v, CPU %+v: want OK with the first pair scored and no throughput run", rep.OK, rep.CPU)
	}
	all := strings.Join(rep.Skipped, "\n")
	for _, want := range []string{"cpu: scored 1 of the sample's 24 pairs", "cpu: throughput run skipped"} {
		if !strings.Contains(all, want) {
			t.Errorf("skipped %q, want it to say %q", all, want)
		}
	}
	var text bytes.Buffer
	if err := WriteText(&text, rep); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"skipped        cpu: scored 1 of", "throughput not measured", "budget 0 s"} {
		if !strings.Contains(text.String(), want) {
			t.Errorf("text report lacks %q:\n%s", want, text.String())
		}
	}

	ref := checkCPU(t.Context(), nil, nil, o, nil, &budget{deadline: time.Now().Add(time.Minute), skipped: new([]string)}, false, time.Hour)
	if ref.Skipped == "" || ref.OK {
		t.Errorf("CPU reference with a minute left after an hour-long GPU pool opening: %+v, want it skipped", ref)
	}
}

// scoreSample scores the first pair whatever the budget, and a next chunk
// only when the time per pair so far says it fits in what is left.
func TestScoreSampleStopsAtTheBudget(t *testing.T) {
	pairs := make([]model.Pair, 10)
	var calls [][]model.Pair
	score := func(_ context.Context, p []model.Pair) ([]float32, error) {
		calls = append(calls, p)
		time.Sleep(time.Millisecond) // a per-pair time above zero
		return make([]float32, len(p)), nil
	}
	for _, tc := range []struct {
		left       time.Duration
		want, runs int
	}{{time.Hour, 10, 4}, {0, 1, 1}, {-time.Second, 1, 1}} {
		calls = nil
		got, perPair, err := scoreSample(t.Context(), score, pairs, 3, func() time.Duration { return tc.left })
		if err != nil || len(got) != tc.want || len(calls) != tc.runs || perPair <= 0 {
			t.Errorf("left %v: %d scores in %d calls (%v a pair, %v), want %d in %d", tc.left, len(got), len(calls), perPair, err, tc.want, tc.runs)
		}
	}
}
