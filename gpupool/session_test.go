package gpupool

import (
	"bufio"
	"bytes"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/rs/zerolog"

	"github.com/scorer/scorer/internal/testenv"
	"github.com/scorer/scorer/model"
)

// realPairs encodes the first sentences of the real transcript corpus
// against three label hypotheses, as the service does.
func realPairs(t *testing.T, m *model.Model, sentences int) []model.Pair {
	t.Helper()
	f, err := os.Open(testenv.Transcripts(t))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var texts []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for sc.Scan() && len(texts) < sentences {
		var ev struct {
			Sections map[string][]string `json:"sections"`
		}
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			t.Fatalf("transcript line: %v", err)
		}
		for _, key := range []string{"FILT_MD", "FILT_QA"} {
			for _, s := range ev.Sections[key] {
				if len(texts) < sentences && strings.TrimSpace(s) != "" {
					texts = append(texts, s)
				}
			}
		}
	}
	if len(texts) < sentences {
		t.Fatalf("corpus gave %d sentences, want %d", len(texts), sentences)
	}
	var hyps [][]int32
	for _, l := range []string{"consumer strength", "consumer weakness", "reduced consumer's spending patterns"} {
		h, err := m.Tokenizer.Encode("This text is about " + l + ".")
		if err != nil {
			t.Fatal(err)
		}
		hyps = append(hyps, h)
	}
	var pairs []model.Pair
	for _, s := range texts {
		prem, err := m.Tokenizer.Encode(s)
		if err != nil {
			t.Fatal(err)
		}
		for _, h := range hyps {
			pairs = append(pairs, m.Tokenizer.EncodePair(prem, h, m.MaxLength))
		}
	}
	return pairs
}

// TestPoolMatchesSessionOnRealModel scores real pairs through the pool (CPU,
// several batches of mixed order) and directly through one Session, with
// the real model and ONNX Runtime: batching, sorting and scattering back
// must not change a score.
func TestPoolMatchesSessionOnRealModel(t *testing.T) {
	if testing.Short() {
		t.Skip("real ONNX Runtime model test")
	}
	shutdown, err := model.InitRuntime(testenv.ORTLib(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := shutdown(); err != nil {
			t.Error(err)
		}
	})
	for _, dir := range testenv.ModelDirs(t) {
		t.Run(filepath.Base(dir), func(t *testing.T) { poolMatchesSession(t, dir) })
	}
}

// poolMatchesSession is TestPoolMatchesSessionOnRealModel on one model folder.
func poolMatchesSession(t *testing.T, dir string) {
	m, err := model.Load(model.LoadOptions{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	pairs := realPairs(t, m, 100)

	sess, err := m.NewSession(model.SessionOptions{IntraOpThreads: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()
	want := make([]float32, 0, len(pairs))
	for i := 0; i < len(pairs); i += 30 { // input order, small batches
		s, err := sess.ScorePairs(testCtx(t), pairs[i:min(len(pairs), i+30)])
		if err != nil {
			t.Fatal(err)
		}
		want = append(want, s...)
	}

	p, err := New(testCtx(t), SessionFactory(m, SessionConfig{IntraOpThreads: 2}), Mode(ModeCPU),
		MaxBatchTokens(2048), MaxBatchRows(64))
	if err != nil {
		t.Fatal(err)
	}
	// Close the pool (and its session) before the ORT environment goes.
	defer func() {
		if err := p.Close(testCtx(t)); err != nil {
			t.Error(err)
		}
	}()
	got, err := p.ScorePairs(testCtx(t), pairs)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(want) {
		t.Fatalf("pool gave %d scores, session %d", len(got), len(want))
	}
	var worst float64
	for i := range got {
		d := math.Abs(float64(got[i] - want[i]))
		worst = max(worst, d)
		if d > 1e-5 {
			t.Errorf("pair %d: pool %v, session %v", i, got[i], want[i])
		}
	}
	st := p.Stats()
	t.Logf("%d pairs in %d batches, padding efficiency %.3f, worst diff %.2g", st.Pairs, st.Batches, st.PaddingEfficiency(), worst)
	if st.Batches < 2 || st.Pairs != uint64(len(pairs)) {
		t.Errorf("stats %+v: want several batches covering every pair", st)
	}

	// A GPU NVML lists but whose CUDA engine cannot open (this ORT build
	// has no CUDA provider) is skipped: auto mode ends on the CPU, with the
	// reason in its one warning.
	t.Run("CUDA engine fails to open", func(t *testing.T) {
		var logs bytes.Buffer
		probe := newFakeProbe(&fakeGPU{total: 16 << 30})
		p2, err := New(testCtx(t), SessionFactory(m, SessionConfig{IntraOpThreads: 1, GPUMemFraction: 0.8}),
			Mode(ModeAuto), WithProbe(probe), Logger(zerolog.New(&logs)))
		if err != nil {
			t.Fatal(err)
		}
		defer func() {
			if err := p2.Close(testCtx(t)); err != nil {
				t.Error(err)
			}
		}()
		if devs := p2.Devices(); len(devs) != 1 || devs[0].Kind != CPU {
			t.Fatalf("Devices() = %+v, want the CPU", devs)
		}
		if n := strings.Count(logs.String(), `"level":"warn"`); n != 1 || !strings.Contains(logs.String(), "cuda:0") {
			t.Fatalf("want one warning naming cuda:0, got:\n%s", logs.String())
		}
		t.Logf("warning: %s", strings.TrimSpace(logs.String()))
		got2, err := p2.ScorePairs(testCtx(t), pairs[:30])
		if err != nil {
			t.Fatal(err)
		}
		for i := range got2 {
			if d := math.Abs(float64(got2[i] - want[i])); d > 1e-5 {
				t.Errorf("pair %d: %v, want %v", i, got2[i], want[i])
			}
		}
	})
}

func TestCUDAProviderOptions(t *testing.T) {
	dev := Device{Kind: CUDA, Index: 3, TotalMemory: 10 << 30}
	o := cudaProviderOptions(dev, SessionConfig{GPUMemFraction: 0.5, CUDAOptions: map[string]string{"cudnn_conv_algo_search": "HEURISTIC"}})
	want := map[string]string{"device_id": "3", "arena_extend_strategy": "kSameAsRequested",
		"gpu_mem_limit": "4831838208", "cudnn_conv_algo_search": "HEURISTIC"} // 5 GiB - 512 MiB
	for k, v := range want {
		if o[k] != v {
			t.Errorf("%s = %q, want %q", k, o[k], v)
		}
	}
	if o := cudaProviderOptions(dev, SessionConfig{}); o["gpu_mem_limit"] != "" || o["use_tf32"] != "0" {
		t.Errorf("no fraction or limit set: gpu_mem_limit = %q, use_tf32 = %q (want unset, 0: TF32 off by default)", o["gpu_mem_limit"], o["use_tf32"])
	}
	if o := cudaProviderOptions(dev, SessionConfig{TF32: true}); o["use_tf32"] != "1" {
		t.Errorf("TF32 on: use_tf32 = %q", o["use_tf32"])
	}
}

// The arena cap sits a margin below the admission limit (MemFraction ×
// total), so context and workspaces beside a full arena keep used memory
// under the limit.
func TestGPUMemLimitBelowAdmissionLimit(t *testing.T) {
	const gib = 1 << 30
	for _, tc := range []struct {
		name  string
		total uint64
		cfg   SessionConfig
		want  uint64
	}{
		{"default margin", 80 * gib, SessionConfig{GPUMemFraction: 0.8}, uint64(0.8*80*gib) - DefaultGPUMemMargin},
		{"margin below the least is raised", 80 * gib, SessionConfig{GPUMemFraction: 0.8, GPUMemMargin: 1 << 20}, uint64(0.8*80*gib) - DefaultGPUMemMargin},
		{"larger margin", 80 * gib, SessionConfig{GPUMemFraction: 0.8, GPUMemMargin: 2 * gib}, uint64(0.8*80*gib) - 2*gib},
		{"whole GPU", 16 * gib, SessionConfig{GPUMemFraction: 1}, 16*gib - DefaultGPUMemMargin},
		{"GPU too small for the margin: half the budget", 1 * gib, SessionConfig{GPUMemFraction: 0.5}, 256 << 20},
		{"explicit limit wins", 80 * gib, SessionConfig{GPUMemFraction: 0.8, GPUMemLimit: 7 * gib}, 7 * gib},
		{"process budget in bytes", 80 * gib, SessionConfig{GPUMemFraction: 0.8, GPUMemBudget: MemLimit{Bytes: 20 * gib}}, 20*gib - DefaultGPUMemMargin},
		{"process budget as a fraction", 80 * gib, SessionConfig{GPUMemFraction: 0.8, GPUMemBudget: MemLimit{Fraction: 0.25}}, 20*gib - DefaultGPUMemMargin},
		{"budget above the fraction", 80 * gib, SessionConfig{GPUMemFraction: 0.5, GPUMemBudget: MemLimit{Bytes: 60 * gib}}, 40*gib - DefaultGPUMemMargin},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := cudaProviderOptions(Device{Kind: CUDA, TotalMemory: tc.total}, tc.cfg)
			if got := o["gpu_mem_limit"]; got != strconv.FormatUint(tc.want, 10) {
				t.Fatalf("gpu_mem_limit = %s, want %d", got, tc.want)
			}
			if tc.cfg.GPUMemLimit == 0 && float64(tc.want) >= tc.cfg.GPUMemFraction*float64(tc.total) {
				t.Fatalf("arena cap %d not below the admission limit", tc.want)
			}
		})
	}
}

// CUDA sessions run without memory patterns and can shrink their own
// device's arena (calibration's per-shape measurement); CPU sessions keep
// ORT's defaults.
func TestSessionOptionsPerDevice(t *testing.T) {
	o, err := sessionOptions(Device{Kind: CUDA, Index: 3}, SessionConfig{})
	if err != nil || !o.DisableMemPattern || o.ShrinkArenas != "gpu:3" || o.Configure == nil {
		t.Errorf("CUDA options %+v, %v: want memory patterns off, ShrinkArenas gpu:3 and the CUDA provider", o, err)
	}
	o, err = sessionOptions(Device{Kind: CPU}, SessionConfig{IntraOpThreads: 2})
	if err != nil || o.DisableMemPattern || o.ShrinkArenas != "" || o.Configure != nil || o.IntraOpThreads != 2 {
		t.Errorf("CPU options %+v, %v: want ORT's defaults with 2 threads", o, err)
	}
	if _, err := sessionOptions(Device{Kind: DeviceKind(9)}, SessionConfig{}); err == nil {
		t.Error("unknown device kind accepted")
	}
}
