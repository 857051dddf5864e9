package scoring

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rs/zerolog"

	"github.com/scorer/scorer/gpupool"
	"github.com/scorer/scorer/internal/config"
	"github.com/scorer/scorer/internal/testenv"
)

// cpuBaselineChild names the environment variable that makes
// TestWarmStartCPUBaseline's process one start of the scorer.
const cpuBaselineChild = "SCORER_TEST_CPU_BASELINE_START"

// TestWarmStartCPUBaseline: a start whose CPU session maps its weights
// from GRAPH_CACHE, and whose CPU memory calibration is kept, budgets CPU
// batches from the same resident baseline as the start that measured: the
// weights count although no run has touched them yet. Before, the warm
// start read VmRSS before any run, when the mapped weights were not yet
// resident, and budgeted the memory they take once faulted in as free for
// activations. Each start is a process of its own, as a pod's restart is:
// in one process the first start's freed heap stays resident under the
// second. Real ONNX Runtime and nli-unigram-small, whose weights are
// most of what a start adds to the process: 13 MB of layers, which the
// cold start's session copies into the heap and packs, and a 16 MB
// embedding that both starts map and few batches read (measured: 77.7 MB
// resident on the cold start, 60.6 MB on the warm one).
func TestWarmStartCPUBaseline(t *testing.T) {
	if os.Getenv(cpuBaselineChild) != "" {
		cpuBaselineStart(t)
		return
	}
	dir := t.TempDir()
	env := map[string]string{
		"MODEL_DIR":             testenv.ModelDir(t, "nli-unigram-small"),
		"DEVICE":                "cpu",
		"GRAPH_CACHE":           filepath.Join(dir, "graph"),
		"GRAPH_CACHE_WAIT":      "true",
		"CPU_CALIBRATION_CACHE": filepath.Join(dir, "cpu-calibration"),
		"CPU_MEM_LIMIT":         "4GiB",
		"SCORE_CACHE_BYTES":     "0",
		"ORT_LIB":               testenv.ORTLib(t),
		// Less garbage on the Go heap when the baseline is read, most of
		// the noise between two starts under -race.
		"GOGC": "25",
	}
	start := func(n int) cpuBaselineReport {
		t.Helper()
		cmd := exec.CommandContext(t.Context(), os.Args[0], "-test.run=^TestWarmStartCPUBaseline$", "-test.count=1")
		cmd.Env = append(os.Environ(), cpuBaselineChild+"=1")
		for k, v := range env {
			cmd.Env = append(cmd.Env, k+"="+v)
		}
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("start %d: %v\n%s", n, err, out)
		}
		var r cpuBaselineReport
		sc := bufio.NewScanner(bytes.NewReader(out))
		for sc.Scan() {
			if l, ok := strings.CutPrefix(sc.Text(), "cpu-baseline: "); ok {
				if err := json.Unmarshal([]byte(l), &r); err != nil {
					t.Fatal(err)
				}
				return r
			}
		}
		t.Fatalf("start %d reported nothing:\n%s", n, out)
		return r
	}
	cold := start(1)
	warm := start(2)
	t.Logf("cold start: %+v", cold)
	t.Logf("warm start: %+v", warm)
	if cold.GraphCacheHit || !warm.GraphCacheHit || cold.CalibrationCached || !warm.CalibrationCached {
		t.Fatalf("want a cold start that measures and builds the entry, then a warm one that takes both: %+v, %+v", cold, warm)
	}
	if d := float64(warm.Baseline)/float64(cold.Baseline) - 1; d < -0.05 || d > 0.05 {
		t.Errorf("warm start's baseline %d bytes, cold start's %d: %+.1f%%, want within 5%%", warm.Baseline, cold.Baseline, 100*d)
	}
}

// cpuBaselineReport is what one start of TestWarmStartCPUBaseline saw.
type cpuBaselineReport struct {
	Baseline          uint64
	Budget            float64
	GraphCacheHit     bool
	CalibrationCached bool
}

// cpuBaselineStart opens the stack once from the environment and prints
// its CPU device's baseline.
func cpuBaselineStart(t *testing.T) {
	cfg, err := config.FromEnv(os.Getenv)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	s, err := Open(context.Background(), cfg, zerolog.New(zerolog.SyncWriter(&buf)), nil)
	if err != nil {
		t.Fatal(err)
	}
	var r cpuBaselineReport
	for _, d := range s.Pool.Stats().Devices {
		if d.Device.Kind == gpupool.CPU {
			r.Baseline, r.Budget = d.Memory.BaselineBytes, d.Memory.BudgetBytes
		}
	}
	if err := s.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	lines := logLines(t, &buf)
	r.GraphCacheHit = lines["CPU session loaded from the graph cache: ONNX Runtime's optimised graph and prepacked weights written at an earlier start"] != nil
	r.CalibrationCached = lines["gpupool: cpu: memory calibration taken from the cache: measured at an earlier start with the same model, ONNX Runtime, session options and machine"] != nil
	b, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Printf("cpu-baseline: %s\n", b)
}
