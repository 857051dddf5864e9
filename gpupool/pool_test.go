package gpupool

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/scorer/scorer/model"
)

// testCtx is t.Context with a deadline, so no test can hang.
func testCtx(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func newPool(t *testing.T, f *fakeFactory, opts ...Option) *Pool {
	t.Helper()
	p, err := New(testCtx(t), f.factory, opts...)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = p.Close(ctx)
	})
	return p
}

// gpuOpts is a two-GPU fake setup with ample memory and no calibration.
func gpuOpts(probe *fakeProbe, extra ...Option) []Option {
	return append([]Option{Mode(ModeCUDA), WithProbe(probe),
		Calibrate(Calibration{Disabled: true, FallbackBase: 1, FallbackPerToken: 1}),
		withHeadroom(1), withAdmissionBackoff(time.Millisecond)}, extra...)
}

func TestScorePairsInputOrderConcurrentCalls(t *testing.T) {
	f := newFakeFactory(nil)
	p := newPool(t, f, Mode(ModeCPU), MaxBatchTokens(512), MaxBatchRows(16), WorkersPerDevice(3))
	var calls [][]model.Pair
	for c := 0; c < 8; c++ {
		calls = append(calls, makePairs(realisticLengths(200+c*37, uint64(c))))
	}
	for _, err := range scoreConcurrently(t, []*Pool{p}, calls) {
		t.Error(err)
	}
	st := p.Stats()
	if st.Pairs == 0 || st.Batches < 8 || st.QueuedPairs != 0 || st.InFlightBatches != 0 {
		t.Errorf("stats after all calls: %+v", st)
	}
	if got, err := p.ScorePairs(testCtx(t), nil); err != nil || len(got) != 0 {
		t.Errorf("empty call = %v, %v", got, err)
	}
}

func TestPullSchedulingFasterDeviceTakesMore(t *testing.T) {
	probe := newFakeProbe(&fakeGPU{total: 80 << 30}, &fakeGPU{total: 80 << 30})
	f := newFakeFactory(map[string]*fakeEngine{
		"cuda:0": {delay: 1 * time.Millisecond},
		"cuda:1": {delay: 12 * time.Millisecond},
	})
	p := newPool(t, f, gpuOpts(probe, MaxBatchRows(8), WorkersPerDevice(1))...)
	lens := make([]int, 400)
	for i := range lens {
		lens[i] = 16
	}
	pairs := makePairs(lens)
	mustScore(t, p, pairs)
	st := p.Stats()
	fast, slow := st.Devices[0].Batches, st.Devices[1].Batches
	t.Logf("fast device ran %d batches, slow %d", fast, slow)
	if fast+slow != 50 || fast < 2*slow {
		t.Errorf("fast %d, slow %d batches: want 50 total and the fast device at least twice the slow", fast, slow)
	}
}

func TestAdmissionSplitsWhenFreeMemoryIsLow(t *testing.T) {
	// 1 KiB per padded token: a 64×16 batch needs 1 MiB, a 16×16 one 256 KiB.
	// 2 GiB leave room for the 768 MiB CUDA takes beside the arena.
	probe := newFakeProbe(&fakeGPU{total: 2 << 30, used: 2<<30 - 400<<10})
	f := newFakeFactory(nil)
	reg := prometheus.NewRegistry()
	p := newPool(t, f, Mode(ModeCUDA), WithProbe(probe), Registerer(reg), withHeadroom(1), MemFraction(1),
		withAdmissionBackoff(time.Millisecond), MaxBatchRows(64),
		Calibrate(Calibration{Disabled: true, FallbackBase: 1, FallbackPerToken: 1 << 10}))
	lens := make([]int, 64)
	for i := range lens {
		lens[i] = 16
	}
	pairs := makePairs(lens)
	mustScore(t, p, pairs)
	_, _, maxRows, _ := f.engine("cuda:0").snapshot()
	if maxRows > 16 {
		t.Errorf("engine ran %d rows at once; 400 KiB free admits at most 16×16", maxRows)
	}
	st := p.Stats()
	if st.Refusals == 0 || st.Splits == 0 {
		t.Errorf("want refusals and splits, got %+v", st)
	}
	if n := metricValue(t, p.m.admission.WithLabelValues("cuda:0", "refuse", "free_memory")); n == 0 {
		t.Errorf("scorer_admission_total{decision=refuse,reason=free_memory} = 0")
	}
	if n := metricValue(t, p.m.gpuMemFree.WithLabelValues("cuda:0")); n != 400<<10 {
		t.Errorf("scorer_gpu_memory_free_bytes = %v, want %v", n, 400<<10)
	}
}

func TestAdmissionWaitsForMemoryFraction(t *testing.T) {
	// used/total at 0.9 is over MemFraction 0.8: refused until memory frees.
	probe := newFakeProbe(&fakeGPU{total: 1 << 30, used: 900 << 20})
	f := newFakeFactory(nil)
	p := newPool(t, f, Mode(ModeCUDA), WithProbe(probe), withHeadroom(1), withAdmissionBackoff(5*time.Millisecond),
		Calibrate(Calibration{Disabled: true, FallbackBase: 1, FallbackPerToken: 1}))
	pairs := makePairs([]int{8})
	go func() {
		time.Sleep(100 * time.Millisecond)
		probe.set(0, func(g *fakeGPU) { g.used = 100 << 20 })
	}()
	start := time.Now()
	mustScore(t, p, pairs)
	if time.Since(start) < 90*time.Millisecond {
		t.Errorf("batch ran after %v, before memory was freed", time.Since(start))
	}
	if n := metricValue(t, p.m.admission.WithLabelValues("cuda:0", "refuse", "mem_fraction")); n == 0 {
		t.Error("no mem_fraction refusal counted")
	}
	if st := p.Stats(); st.Refusals == 0 {
		t.Errorf("stats %+v: want refusals", st)
	}
}

func TestOOMSplitRetryCompletesEverything(t *testing.T) {
	probe := newFakeProbe(&fakeGPU{total: 80 << 30})
	f := newFakeFactory(map[string]*fakeEngine{"cuda:0": {oomOver: 5}})
	reg := prometheus.NewRegistry()
	p := newPool(t, f, gpuOpts(probe, Registerer(reg), MaxBatchRows(64))...)
	pairs := makePairs(realisticLengths(500, 7))
	mustScore(t, p, pairs)
	_, _, maxRows, _ := f.engine("cuda:0").snapshot()
	st := p.Stats()
	if maxRows > 5 || st.OOMRetries == 0 || st.Splits == 0 || st.Devices[0].Degraded || st.Fallbacks != 0 {
		t.Errorf("max rows %d, stats %+v: want splits down to ≤5 rows on a healthy GPU", maxRows, st)
	}
	if n := metricValue(t, p.m.oomRetries.WithLabelValues("cuda:0")); n != float64(st.OOMRetries) {
		t.Errorf("scorer_oom_retries_total = %v, stats say %d", n, st.OOMRetries)
	}
}

func TestRepeatedFailureDegradesToCPUFallback(t *testing.T) {
	probe := newFakeProbe(&fakeGPU{total: 80 << 30})
	f := newFakeFactory(map[string]*fakeEngine{"cuda:0": {err: errFakeCUDA}})
	reg := prometheus.NewRegistry()
	p := newPool(t, f, gpuOpts(probe, Mode(ModeAuto), Registerer(reg), withMaxDeviceFailures(2))...) // cuda never falls back (TestModeCUDAOpensNoCPUEngine)
	pairs := makePairs(realisticLengths(300, 3))
	mustScore(t, p, pairs)
	st := p.Stats()
	if len(st.Devices) != 2 || !st.Devices[0].Degraded || !st.Devices[1].Fallback || st.Devices[1].Pairs != 300 {
		t.Errorf("devices %+v: want cuda:0 degraded and the CPU fallback to score all 300", st.Devices)
	}
	if devs := p.Devices(); len(devs) != 2 || devs[1].Kind != CPU {
		t.Errorf("Devices() = %+v", devs)
	}
	if n := metricValue(t, p.m.fallbacks); n != 1 {
		t.Errorf("scorer_fallbacks_total = %v, want 1", n)
	}
	// Later calls go straight to the CPU.
	again := makePairs([]int{5, 6, 7})
	if scores, err := p.ScorePairs(testCtx(t), again); err != nil || checkScores(again, scores) != nil {
		t.Errorf("after fallback: %v, %v", scores, err)
	}
}

func TestFailureWithoutFallbackIsLoud(t *testing.T) {
	probe := newFakeProbe(&fakeGPU{total: 80 << 30})
	f := newFakeFactory(map[string]*fakeEngine{"cuda:0": {err: errFakeCUDA}})
	p := newPool(t, f, gpuOpts(probe, CPUFallback(false), withMaxDeviceFailures(2))...)
	_, err := p.ScorePairs(testCtx(t), makePairs(realisticLengths(50, 1)))
	if err == nil || !strings.Contains(err.Error(), "gpupool: no device can run") {
		t.Fatalf("err = %v, want a loud no-device error", err)
	}
	// A new call after every device degraded fails at once, not at ctx.
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
	defer cancel()
	if _, err := p.ScorePairs(ctx, makePairs([]int{3})); err == nil || errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("second call err = %v, want an immediate no-device error", err)
	}
}

func TestCPUEngineErrorEndsAfterMaxAttempts(t *testing.T) {
	boom := errors.New("fake: broken input")
	f := newFakeFactory(map[string]*fakeEngine{"cpu": {err: boom}})
	p := newPool(t, f, Mode(ModeCPU), withMaxAttempts(4))
	_, err := p.ScorePairs(testCtx(t), makePairs([]int{4, 4, 4, 4}))
	if !errors.Is(err, boom) {
		t.Fatalf("err = %v, want it to wrap the engine's error", err)
	}
}

func TestCancelRemovesQueuedWork(t *testing.T) {
	gate := make(chan struct{})
	f := newFakeFactory(map[string]*fakeEngine{"cpu": {gate: gate}})
	p := newPool(t, f, Mode(ModeCPU), MaxBatchRows(4), MaxBatchTokens(64))
	ctx, cancel := context.WithCancel(testCtx(t))
	done := make(chan error, 1)
	go func() {
		_, err := p.ScorePairs(ctx, makePairs(make40(8)))
		done <- err
	}()
	waitFor(t, func() bool { st := p.Stats(); return st.InFlightBatches == 1 && st.QueuedPairs == 36 })
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("err = %v, want context.Canceled", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("ScorePairs did not return after cancel")
	}
	waitFor(t, func() bool { st := p.Stats(); return st.QueuedPairs == 0 && st.InFlightBatches == 0 })
	close(gate)
	calls, _, _, _ := f.engine("cpu").snapshot()
	if calls != 1 {
		t.Errorf("engine called %d times; the cancelled call's queued batches must not run", calls)
	}
	// Capacity came back: a new call runs.
	pairs := makePairs([]int{3, 4})
	if scores, err := p.ScorePairs(testCtx(t), pairs); err != nil || checkScores(pairs, scores) != nil {
		t.Fatalf("after cancel: %v, %v", scores, err)
	}
}

func make40(l int) []int {
	lens := make([]int, 40)
	for i := range lens {
		lens[i] = l
	}
	return lens
}

// waitFor polls cond until it holds or 5s pass.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 5s")
		}
		time.Sleep(time.Millisecond)
	}
}

func TestBoundedQueue(t *testing.T) {
	gate := make(chan struct{})
	f := newFakeFactory(map[string]*fakeEngine{"cpu": {gate: gate}})
	reg := prometheus.NewRegistry()
	p := newPool(t, f, Mode(ModeCPU), MaxBatchRows(4), MaxBatchTokens(64), withQueueCapacity(8), Registerer(reg))
	first := make(chan error, 1)
	pairs := makePairs(make40(8))
	go func() {
		scores, err := p.ScorePairs(testCtx(t), pairs)
		if err == nil {
			err = checkScores(pairs, scores)
		}
		first <- err
	}()
	waitFor(t, func() bool { st := p.Stats(); return st.InFlightBatches == 1 && st.QueuedPairs == 4 })
	time.Sleep(20 * time.Millisecond) // the caller stays blocked: no more room
	if st := p.Stats(); st.QueuedPairs+4*st.InFlightBatches > 8 {
		t.Fatalf("pool holds %d queued + %d running batches over capacity 8", st.QueuedPairs, st.InFlightBatches)
	}
	if g := metricValue(t, p.m.queueDepth); g != 4 {
		t.Errorf("scorer_queue_depth_pairs = %v, want 4", g)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	if _, err := p.ScorePairs(ctx, makePairs([]int{2})); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("call into a full pool: err = %v, want DeadlineExceeded", err)
	}
	close(gate)
	select {
	case err := <-first:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("first call never finished")
	}
}

func TestCalibrationFitsMemoryModel(t *testing.T) {
	const base, perToken = 32 << 20, 20 << 10
	probe := newFakeProbe(&fakeGPU{total: 80 << 30, used: 1 << 30})
	f := newFakeFactory(map[string]*fakeEngine{"cuda:0": {onRun: arenaGrowth(base, perToken, func(n uint64) {
		probe.set(0, func(g *fakeGPU) { g.used += n })
	})}})
	p := newPool(t, f, Mode(ModeCUDA), WithProbe(probe), MemFraction(1), Calibrate(Calibration{MaxLen: 256}))
	st := p.Stats().Devices[0]
	if d := st.Memory.PerToken - perToken; d > 1 || d < -1 {
		t.Errorf("per-token estimate %v, want %v", st.Memory.PerToken, perToken)
	}
	if d := st.Memory.Base - base; d > 1024 || d < -1024 {
		t.Errorf("base estimate %v, want %v", st.Memory.Base, base)
	}
	// After calibration the arena holds the largest batch, so a normal
	// batch needs no new memory and is admitted even with little free
	// (another tenant took the rest).
	probe.set(0, func(g *fakeGPU) { g.used = g.total - (300 << 20) })
	defer func() {
		if st := p.Stats(); st.Refusals != 0 || st.Devices[0].Batches == 0 {
			t.Errorf("stats %+v: want the GPU to admit at once", st)
		}
	}()
	pairs := makePairs(realisticLengths(100, 9))
	if scores, err := p.ScorePairs(testCtx(t), pairs); err != nil || checkScores(pairs, scores) != nil {
		t.Fatalf("after calibration: %v", err)
	}
}

func TestGPUSelectionAndFactoryFailures(t *testing.T) {
	probe := newFakeProbe(&fakeGPU{total: 1 << 34}, &fakeGPU{total: 1 << 34}, &fakeGPU{total: 1 << 34})
	f := newFakeFactory(nil)
	f.failFor["cuda:2"] = errors.New("fake: CUDA EP failed to load")
	called := 0
	p := newPool(t, f, gpuOpts(probe, GPUIDs("GPU-fake-2", "1"), withAfterCUDAInit(func() { called++ }))...)
	devs := p.Devices()
	if len(devs) != 1 || devs[0].Index != 1 || devs[0].UUID != "GPU-fake-1" {
		t.Errorf("Devices() = %+v, want only GPU 1 (GPU 2's engine failed)", devs)
	}
	if called != 1 {
		t.Errorf("AfterCUDAInit called %d times, want 1", called)
	}
	if _, err := New(testCtx(t), f.factory, gpuOpts(probe, GPUIDs("7"))...); !errors.Is(err, ErrNoGPU) {
		t.Errorf("unknown GPU id: err = %v, want ErrNoGPU", err)
	}
}

// metricValue reads a counter's or gauge's current value. (client_golang's
// testutil would add a module dependency; this is all the tests need.)
func metricValue(t *testing.T, c prometheus.Collector) float64 {
	t.Helper()
	ch := make(chan prometheus.Metric, 1)
	c.Collect(ch)
	var m dto.Metric
	if err := (<-ch).Write(&m); err != nil {
		t.Fatal(err)
	}
	switch {
	case m.Counter != nil:
		return m.Counter.GetValue()
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	}
	t.Fatalf("metric %v is neither counter nor gauge", &m)
	return 0
}

// TestCPUWorkersOverridesWorkersPerDevice: the CPU device gets CPUWorkers,
// and the workers really run concurrently on it.
func TestCPUWorkersOverridesWorkersPerDevice(t *testing.T) {
	for name, tc := range map[string]struct {
		opts []Option
		want int
	}{
		"default":              {nil, 1},
		"workers per device":   {[]Option{WorkersPerDevice(3)}, 3},
		"cpu workers override": {[]Option{WorkersPerDevice(3), CPUWorkers(2)}, 2},
	} {
		t.Run(name, func(t *testing.T) {
			f := newFakeFactory(nil)
			p := newPool(t, f, append([]Option{Mode(ModeCPU)}, tc.opts...)...)
			st := p.Stats()
			if len(st.Devices) != 1 || st.Devices[0].Workers != tc.want {
				t.Fatalf("devices %+v, want one CPU device with %d workers", st.Devices, tc.want)
			}
		})
	}
	if _, err := New(testCtx(t), newFakeFactory(nil).factory, Mode(ModeCPU), CPUWorkers(-1)); err == nil {
		t.Error("CPUWorkers(-1) accepted")
	}
}

// TestStatsOldestRun: a run that does not return shows in OldestRun, which
// grows while it hangs; once it returns, OldestRun is back to 0.
func TestStatsOldestRun(t *testing.T) {
	gate := make(chan struct{})
	f := newFakeFactory(map[string]*fakeEngine{"cpu": {gate: gate}})
	p := newPool(t, f, Mode(ModeCPU), MaxBatchRows(1), WorkersPerDevice(1))
	if got := p.Stats().OldestRun; got != 0 {
		t.Fatalf("OldestRun = %v before any run, want 0", got)
	}
	done := make(chan error, 1)
	go func() { _, err := p.ScorePairs(testCtx(t), makePairs([]int{8})); done <- err }()
	deadline := time.Now().Add(10 * time.Second)
	for p.Stats().OldestRun < 200*time.Millisecond {
		if time.Now().After(deadline) {
			t.Fatalf("OldestRun = %v 10 s into a hung run", p.Stats().OldestRun)
		}
		time.Sleep(20 * time.Millisecond)
	}
	close(gate)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got := p.Stats().OldestRun; got != 0 {
		t.Errorf("OldestRun = %v after the run returned, want 0", got)
	}
}

// TestCPUBatchShapeAppliesWhereNoGPUWorks: a pool handed both shapes runs
// the CPU's where its own device is the CPU (Mode cpu, or auto where no GPU
// opens) and the wide one on a GPU.
func TestCPUBatchShapeAppliesWhereNoGPUWorks(t *testing.T) {
	lens := make([]int, 200)
	for i := range lens {
		lens[i] = 16
	}
	shapes := []Option{MaxBatchTokens(16384), MaxBatchRows(64), CPUBatchShape(0, 8)}
	noGPU := newFakeProbe(&fakeGPU{total: 1 << 34})
	for name, tc := range map[string]struct {
		opts  []Option
		label string
		want  int
	}{
		"cpu":                {[]Option{Mode(ModeCPU)}, "cpu", 8},
		"auto, no GPU opens": {[]Option{Mode(ModeAuto), WithProbe(noGPU)}, "cpu", 8},
		"gpu":                {gpuOpts(newFakeProbe(&fakeGPU{total: 1 << 34})), "cuda:0", 64},
	} {
		t.Run(name, func(t *testing.T) {
			f := newFakeFactory(nil)
			if tc.label == "cpu" {
				f.failFor["cuda:0"] = errors.New("fake: CUDA EP failed to load")
			}
			p := newPool(t, f, append(tc.opts, append(shapes, WorkersPerDevice(1))...)...)
			mustScore(t, p, makePairs(lens))
			if _, _, maxRows, _ := f.engine(tc.label).snapshot(); maxRows != tc.want {
				t.Errorf("%s ran batches of up to %d rows, want %d", tc.label, maxRows, tc.want)
			}
			if tokens, rows := p.BatchShape(); tokens != 16384 || rows != tc.want {
				t.Errorf("BatchShape() = %d tokens, %d rows, want 16384 and %d", tokens, rows, tc.want)
			}
		})
	}
	if _, err := New(testCtx(t), newFakeFactory(nil).factory, Mode(ModeCPU), CPUBatchShape(-1, 8)); err == nil {
		t.Error("CPUBatchShape(-1, 8) accepted")
	}
}
