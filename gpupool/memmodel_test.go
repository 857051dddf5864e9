package gpupool

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/scorer/scorer/model"
)

// transformerMem is a transformer encoder's device memory per batch: a
// fixed workspace, a per-row cost whatever the length (DeBERTa-v3's
// relative-position Tile), activations linear in the tokens, and attention
// scores growing with rows·heads·len² (several such tensors live at once,
// folded into perScore). Beside the arena, CUDA takes context bytes on the
// first run and stream bytes of workspace for every run going on at once
// (each worker's cuBLAS/cuDNN handles), outside ORT's gpu_mem_limit.
type transformerMem struct {
	weights, workspace uint64
	perRow             float64 // bytes per row, independent of length
	perToken           float64 // bytes per token of activations
	heads              int
	perScore           float64 // bytes per attention score element
	context, stream    uint64
}

func (m transformerMem) footprint(rows, length int) uint64 {
	r, l := float64(rows), float64(length)
	return m.workspace + uint64(r*m.perRow+r*l*m.perToken+r*float64(m.heads)*l*l*m.perScore)
}

// fakeDevice is one GPU's memory shared by every engine on it (one per
// fake process): it records the most ever used and refuses, as an OOM, any
// allocation past its total.
type fakeDevice struct {
	mu          sync.Mutex
	total, used uint64
	maxUsed     uint64
}

func (d *fakeDevice) alloc(n uint64) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.used+n > d.total {
		return false
	}
	d.used += n
	d.maxUsed = max(d.maxUsed, d.used)
	return true
}

func (d *fakeDevice) free(n uint64) {
	d.mu.Lock()
	d.used -= n
	d.mu.Unlock()
}

// deviceProbe reports a fakeDevice through the Probe interface.
type deviceProbe struct{ dev *fakeDevice }

func (p deviceProbe) Devices() ([]DeviceInfo, error) {
	return []DeviceInfo{{Index: 0, UUID: "GPU-fake-shared", Name: "Fake GPU", TotalMemory: p.dev.total}}, nil
}

func (p deviceProbe) MemoryInfo(int) (free, used, total uint64, err error) {
	p.dev.mu.Lock()
	defer p.dev.mu.Unlock()
	return p.dev.total - p.dev.used, p.dev.used, p.dev.total, nil
}

func (deviceProbe) Utilization(int) (uint32, error) { return 50, nil }
func (deviceProbe) Throttled(int) (uint64, error)   { return 0, nil }

// arenaEngine is a fake CUDA session: weights allocated at open, and a BFC
// arena that grows (in 2 MiB chunks, as ORT's does) when the batches
// running at once need more than it holds, never gives memory back except
// on ReleaseArena (ORT's shrinkage run), and fails with an OOM past its cap
// (ORT's gpu_mem_limit) or when the device is full.
type arenaEngine struct {
	dev   *fakeDevice
	mem   transformerMem
	cap   uint64 // arena cap; 0 = none
	delay func(rows, length int) time.Duration
	// need is a batch's arena footprint: mem.footprint unless set.
	need func(rows, length int) uint64

	mu          sync.Mutex
	arena, busy uint64
	ooms        int
	closed      bool
	// running is the runs going on now; streams how many at once there
	// ever were, each holding mem.stream; beside what context and streams
	// hold; maxOwn the most weights, arena and beside ever held together.
	running, streams int
	beside, maxOwn   uint64
	overlap          chan struct{} // closed once two runs went at once
}

const arenaChunk = 2 << 20

func newArenaEngine(dev *fakeDevice, mem transformerMem, arenaCap uint64) (*arenaEngine, error) {
	if !dev.alloc(mem.weights) {
		return nil, fmt.Errorf("fake: weights: %w", model.ErrOutOfMemory)
	}
	return &arenaEngine{dev: dev, mem: mem, cap: arenaCap, need: mem.footprint, overlap: make(chan struct{}), delay: func(rows, length int) time.Duration {
		return time.Duration(rows*length/64) * time.Microsecond
	}}, nil
}

// startRun counts a run in and allocates what CUDA takes outside the arena
// on a first run and on a new high of runs at once.
func (e *arenaEngine) startRun() bool {
	e.running++
	var grow uint64
	if e.streams == 0 {
		grow += e.mem.context
	}
	if e.running > e.streams {
		grow += e.mem.stream
	}
	if grow > 0 && !e.dev.alloc(grow) {
		e.running--
		return false
	}
	e.streams = max(e.streams, e.running)
	if e.streams == 2 {
		select {
		case <-e.overlap:
		default:
			close(e.overlap)
		}
	}
	e.beside += grow
	return true
}

// awaitOverlap holds the one-row run that follows calibration, when only
// one run has ever gone at a time, until a second starts (or a second
// passes): the pool's concurrent warm-up runs then overlap whatever the
// scheduler does, as they do on a GPU where each takes milliseconds.
func (e *arenaEngine) awaitOverlap(rows int) {
	e.mu.Lock()
	wait := rows == 1 && e.streams == 1 && e.running == 1 && e.mem.stream > 0
	e.mu.Unlock()
	if wait {
		select {
		case <-e.overlap:
		case <-time.After(time.Second):
		}
	}
}

func (e *arenaEngine) ScorePairs(ctx context.Context, pairs []model.Pair) ([]float32, error) {
	length := 0
	for _, p := range pairs {
		length = max(length, p.Len())
	}
	need := e.need(len(pairs), length)
	e.mu.Lock()
	oom := func() ([]float32, error) {
		e.ooms++
		e.mu.Unlock()
		return nil, fmt.Errorf("fake: %d×%d batch: %w", len(pairs), length, model.ErrOutOfMemory)
	}
	if !e.startRun() {
		return oom()
	}
	if e.busy+need > e.arena {
		grow := (e.busy + need - e.arena + arenaChunk - 1) / arenaChunk * arenaChunk
		if (e.cap > 0 && e.arena+grow > e.cap) || !e.dev.alloc(grow) {
			e.running--
			return oom()
		}
		e.arena += grow
	}
	e.busy += need
	e.maxOwn = max(e.maxOwn, e.mem.weights+e.arena+e.beside)
	e.mu.Unlock()
	defer func() {
		e.mu.Lock()
		e.busy -= need
		e.running--
		e.mu.Unlock()
	}()
	e.awaitOverlap(len(pairs))
	select {
	case <-time.After(e.delay(len(pairs), length)):
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	out := make([]float32, len(pairs))
	for i, p := range pairs {
		out[i] = float32(p.IDs[0])
	}
	return out, nil
}

// ReleaseArena gives back every chunk no running batch uses.
func (e *arenaEngine) ReleaseArena(context.Context) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	keep := (e.busy + arenaChunk - 1) / arenaChunk * arenaChunk
	if e.arena > keep {
		e.dev.free(e.arena - keep)
		e.arena = keep
	}
	return nil
}

func (e *arenaEngine) MaxLength() int { return 512 }

func (e *arenaEngine) Close() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if !e.closed {
		e.closed = true
		e.dev.free(e.arena + e.mem.weights + e.beside)
	}
	return nil
}

func (e *arenaEngine) oomCount() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.ooms
}

// ownPeak is the most the engine held since the last call: weights, arena
// and CUDA's own memory.
func (e *arenaEngine) ownPeak() uint64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	peak := e.maxOwn
	e.maxOwn = e.mem.weights + e.arena + e.beside
	return peak
}

// mixedLengths is a transcript-like workload with a heavy tail: most pairs
// are sentence-sized, a third are long paragraphs up to the model's 512.
func mixedLengths(r *rand.Rand, n int) []int {
	lens := make([]int, n)
	for i := range lens {
		if r.IntN(3) == 0 {
			lens[i] = 200 + r.IntN(313)
		} else {
			lens[i] = min(512, 12+int(36*r.ExpFloat64()))
		}
	}
	return lens
}

// deberta is roughly deberta-v3-large in fp32 on a GPU: 1.7 GB of weights,
// 2.6 MiB per row whatever its length and 100 KiB of live activations per
// token, 16 heads and about six live float32 tensors per attention score;
// beside the arena a 400 MiB context and 180 MiB of workspace per run at
// once (764 MiB with two workers, as measured on an H200).
var deberta = transformerMem{weights: 1700 << 20, workspace: 64 << 20, perRow: 2.6 * (1 << 20), perToken: 100 << 10,
	heads: 16, perScore: 24, context: 400 << 20, stream: 182 << 20}

// In float16 the two differ by more than the weights. BERT-large keeps
// about four float16 tensors per attention score (scores, mask-added,
// softmax, its gradient-free copy): 8 bytes. DeBERTa-v3-large's
// disentangled attention adds, per layer, the c2p and p2c GatherElements
// whose index tensors are int64 of rows·heads·len² elements each (8 bytes,
// more than the float16 scores themselves) beside their gathered float16
// results: about 16 + 4·2 = 24 bytes, three times BERT's len² coefficient
// at the same hidden size.
// Its per-row term (the relative-position Tile) is 0.7 MiB in fp16;
// BERT has none.
var (
	bertFP16 = transformerMem{weights: 670 << 20, workspace: 64 << 20, perToken: 50 << 10, heads: 16, perScore: 8,
		context: 400 << 20, stream: 134 << 20}
	debertaFP16 = transformerMem{weights: 870 << 20, workspace: 64 << 20, perRow: 0.7 * (1 << 20), perToken: 50 << 10,
		heads: 16, perScore: 24, context: 400 << 20, stream: 134 << 20}
)

// TestCalibrationFitsTransformerMemory: calibration measures each shape
// from an empty arena and recovers the linear and the len² cost, so the
// estimate neither misses long batches' attention memory nor overcharges
// short ones.
// It does so for fp32 and for fp16 BERT- and DeBERTa-like costs, and the
// fitted len² coefficient tells DeBERTa's (int64 gather indices) from
// BERT's by the factor they really differ.
func TestCalibrationFitsTransformerMemory(t *testing.T) {
	fitted := map[string]float64{}
	for _, tc := range []struct {
		name string
		mem  transformerMem
	}{{"deberta-fp32", deberta}, {"bert-fp16", bertFP16}, {"deberta-fp16", debertaFP16}} {
		t.Run(tc.name, func(t *testing.T) {
			mem := tc.mem
			dev := &fakeDevice{total: 80 << 30}
			probe := deviceProbe{dev}
			factory := func(Device) (Engine, error) { return newArenaEngine(dev, mem, 0) }
			p, err := New(testCtx(t), factory, Mode(ModeCUDA), WithProbe(probe), MaxBatchTokens(16384))
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close(context.Background())
			est := p.devices[0].est
			wantC := float64(mem.heads) * mem.perScore
			if !est.calibrated || rel(est.perToken, mem.perToken) > 0.05 || rel(est.perTokenLen, wantC) > 0.05 ||
				math.Abs(est.perRow-mem.perRow) > 0.1*mem.perRow+64<<10 {
				t.Fatalf("fit base %.3g, per row %.4g (want %.4g), per token %.4g (want %.4g), per token·len %.4g (want %.4g)",
					est.base, est.perRow, mem.perRow, est.perToken, mem.perToken, est.perTokenLen, wantC)
			}
			fitted[tc.name] = est.perTokenLen
			if est.weights != mem.weights {
				t.Errorf("weights %d, want %d", est.weights, mem.weights)
			}
			// Every shape is covered with the margin, and no shape is
			// overcharged by more than the margin plus chunk rounding.
			for _, s := range []Shape{{1, 8}, {256, 64}, {128, 128}, {64, 256}, {32, 512}, {8, 512}} {
				truth := float64(mem.footprint(s.Rows, s.Len))
				got := est.bytes(s.Rows, s.Len)
				if got < truth || got > truth*1.2+4*arenaChunk {
					t.Errorf("%d×%d: estimate %.0f MiB, true %.0f MiB", s.Rows, s.Len, got/(1<<20), truth/(1<<20))
				}
			}
		})
	}
	if r := fitted["deberta-fp16"] / fitted["bert-fp16"]; !(r > 2.7 && r < 3.3) {
		t.Errorf("fitted len² coefficient DeBERTa/BERT in fp16: %.2f, want the true 3", r)
	}
}

func rel(got, want float64) float64 {
	if want == 0 {
		return got
	}
	d := (got - want) / want
	if d < 0 {
		return -d
	}
	return d
}

// TestTransformerWorkloadStaysInMemory drives a randomized transcript
// workload (a third long pairs) at a GPU too small for the token budget's
// long batches: the device never passes the admission limit, nothing runs
// out of memory, and the average batch stays within 15% of the best any
// admission could do (the planner given the true memory cost).
func TestTransformerWorkloadStaysInMemory(t *testing.T) {
	for _, tc := range []struct {
		name string
		mem  transformerMem
	}{{"deberta-fp32", deberta}, {"deberta-fp16", debertaFP16}} {
		t.Run(tc.name, func(t *testing.T) { workloadStaysInMemory(t, tc.mem) })
	}
}

func workloadStaysInMemory(t *testing.T, mem transformerMem) {
	const (
		total    = 8 << 30
		fraction = 0.8
		headroom = 256 << 20
	)
	limit := uint64(total) * 4 / 5 // fraction
	dev := &fakeDevice{total: total}
	var eng *arenaEngine
	factory := func(d Device) (Engine, error) {
		e, err := newArenaEngine(dev, mem, arenaLimit(fraction*float64(d.TotalMemory), DefaultGPUMemMargin))
		eng = e
		return e, err
	}
	p, err := New(testCtx(t), factory, Mode(ModeCUDA), WithProbe(deviceProbe{dev}), MemFraction(fraction),
		withHeadroom(headroom), MaxBatchTokens(32768), MaxBatchRows(256), withAdmissionBackoff(2*time.Millisecond), CPUFallback(false))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close(context.Background())
	calOOMs := eng.oomCount() // calibration may probe past the arena cap; that is its job
	// Calibration's largest shapes are bounded by the arena cap (ORT's
	// gpu_mem_limit), not by admission: the limit holds from here on.
	dev.mu.Lock()
	dev.maxUsed = dev.used
	dev.mu.Unlock()

	r := rand.New(rand.NewPCG(12, 1))
	var calls [][]model.Pair
	for range 40 {
		calls = append(calls, makePairs(mixedLengths(r, 50+r.IntN(400))))
	}
	if errs := scoreConcurrently(t, []*Pool{p}, calls); len(errs) > 0 {
		t.Fatal(errs[0])
	}
	st := p.Stats()
	if n := eng.oomCount() - calOOMs; n != 0 || st.OOMRetries != 0 {
		t.Errorf("%d OOMs in the engine (%d retries): admission let too much run", n, st.OOMRetries)
	}
	if dev.maxUsed > limit {
		t.Errorf("device used %d MiB at most, limit %d MiB", dev.maxUsed>>20, limit>>20)
	}
	// The best possible: the planner cutting every call with the true
	// memory cost of an idle device (no margin, no estimate).
	room := float64(limit) - float64(mem.weights) - float64(mem.context+2*mem.stream) - headroom
	truth := func(length int) int {
		per := mem.perRow + mem.perToken*float64(length) + float64(mem.heads)*mem.perScore*float64(length*length)
		return max(1, int((room-float64(mem.workspace))/per))
	}
	var bestBatches, pairs int
	for _, c := range calls {
		bestBatches += len(planBatches(c, 32768, 256, 32768/32, truth))
		pairs += len(c)
	}
	best := float64(pairs) / float64(bestBatches)
	got := float64(st.Pairs) / float64(st.Batches)
	t.Logf("average batch %.1f pairs, best %.1f; %d refusals, %d splits; device peak %d of %d MiB",
		got, best, st.Refusals, st.Splits, dev.maxUsed>>20, limit>>20)
	if got < 0.85*best {
		t.Errorf("average batch %.1f pairs, want within 15%% of the best %.1f", got, best)
	}
}

func TestParseMemLimit(t *testing.T) {
	for in, want := range map[string]MemLimit{
		"": {}, "0": {}, "0.45": {Fraction: 0.45}, "1.0": {Fraction: 1}, "12GiB": {Bytes: 12 << 30},
		"12G": {Bytes: 12e9}, "512MiB": {Bytes: 512 << 20}, "12884901888": {Bytes: 12884901888}, " 2 gib ": {Bytes: 2 << 30},
	} {
		got, err := ParseMemLimit(in)
		if err != nil || got != want {
			t.Errorf("ParseMemLimit(%q) = %+v, %v; want %+v", in, got, err, want)
		}
	}
	for _, in := range []string{"1.5", "0.0", "-1", "12XB", "GiB", "abc", "-0.5"} {
		if got, err := ParseMemLimit(in); err == nil {
			t.Errorf("ParseMemLimit(%q) = %+v, want an error", in, got)
		}
	}
	if got := (MemLimit{Fraction: 0.25}).Of(8 << 30); got != 2<<30 {
		t.Errorf("0.25 of 8 GiB = %d", got)
	}
}

// flakyEngine fails every run while failing is set, as a GPU does through
// a transient fault, and works again once it is cleared.
type flakyEngine struct {
	fakeEngine
	failing atomic.Bool
}

func (e *flakyEngine) ScorePairs(ctx context.Context, pairs []model.Pair) ([]float32, error) {
	if e.failing.Load() {
		return nil, errFakeCUDA
	}
	return e.fakeEngine.ScorePairs(ctx, pairs)
}

// A GPU degraded by failures is not lost until restart: after its
// probation a re-probe that fails keeps it out, one that passes brings it
// back with workers, and scorer_gpu_degraded follows.
func TestDegradedGPUReprobedAfterProbation(t *testing.T) {
	probe := newFakeProbe(&fakeGPU{total: 80 << 30})
	gpu := &flakyEngine{}
	factory := func(d Device) (Engine, error) {
		if d.Kind == CUDA {
			return gpu, nil
		}
		return &fakeEngine{}, nil
	}
	reg := prometheus.NewRegistry()
	p, err := New(testCtx(t), factory, Mode(ModeCUDA), WithProbe(probe), Calibrate(Calibration{Disabled: true}),
		Probation(100*time.Millisecond), withMaxAttempts(100), Registerer(reg))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close(context.Background())
	degraded := func() float64 {
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() != "scorer_gpu_degraded" {
				continue
			}
			for _, m := range mf.GetMetric() {
				for _, l := range m.GetLabel() {
					if l.GetName() == "device" && l.GetValue() == "cuda:0" {
						return m.GetGauge().GetValue()
					}
				}
			}
		}
		t.Fatal("no scorer_gpu_degraded{device=cuda:0} series")
		return 0
	}
	gpu.failing.Store(true)
	mustScore(t, p, makePairs([]int{10, 12, 14})) // fails over to the CPU fallback
	if st := p.Stats(); !st.Devices[0].Degraded || degraded() != 1 {
		t.Fatalf("after failures: degraded %v, gauge %v; want degraded, 1", st.Devices[0].Degraded, degraded())
	}
	time.Sleep(250 * time.Millisecond) // at least one failed re-probe
	if !p.Stats().Devices[0].Degraded {
		t.Fatal("a GPU still failing passed its re-probe")
	}
	gpu.failing.Store(false)
	deadline := time.Now().Add(5 * time.Second)
	for p.Stats().Devices[0].Degraded {
		if time.Now().After(deadline) {
			t.Fatal("the recovered GPU was not brought back")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if degraded() != 0 {
		t.Errorf("gauge %v after recovery, want 0", degraded())
	}
	before := p.Stats().Devices[0].Batches
	for range 20 {
		mustScore(t, p, makePairs([]int{10, 12, 14}))
	}
	// The CPU fallback is the last resort: the recovered GPU takes it all.
	if st := p.Stats(); st.Devices[0].Batches != before+20 {
		t.Errorf("the recovered GPU took %d of 20 batches: %+v", st.Devices[0].Batches-before, st)
	}
}

// Two scorers share one GPU, each with GPU_MEM_LIMIT=0.45: under a backlog
// in both, each keeps its footprint in its share, CUDA's own memory beside
// the arena included (the first GPU run measured 764 MiB of it, which
// admission used to leave out), so together they never pass the device,
// nothing runs out of memory, and both keep the GPU (neither degrades to
// the CPU).
func TestTwoPoolsShareOneGPU(t *testing.T) {
	const total = 16 << 30
	dev := &fakeDevice{total: total}
	share := MemLimit{Fraction: 0.45}
	var engines []*arenaEngine
	var mu sync.Mutex
	open := func() *Pool {
		factory := func(d Device) (Engine, error) {
			cfg := SessionConfig{GPUMemFraction: 0.9, GPUMemBudget: share}
			cap, _ := strconv.ParseUint(cudaProviderOptions(d, cfg)["gpu_mem_limit"], 10, 64)
			e, err := newArenaEngine(dev, deberta, cap)
			mu.Lock()
			engines = append(engines, e)
			mu.Unlock()
			return e, err
		}
		p, err := New(testCtx(t), factory, Mode(ModeCUDA), WithProbe(deviceProbe{dev}), MemFraction(0.9), GPUMemLimit(share),
			MaxBatchTokens(32768), withAdmissionBackoff(2*time.Millisecond), CPUFallback(false))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Close(context.Background()) })
		return p
	}
	pools := []*Pool{open(), open()}
	calOOMs := 0
	for _, e := range engines {
		calOOMs += e.oomCount()
		// Calibration is bounded by the arena cap, not admission.
		e.ownPeak()
	}
	r := rand.New(rand.NewPCG(7, 3))
	var calls [][]model.Pair
	for range 32 {
		calls = append(calls, makePairs(mixedLengths(r, 100+r.IntN(300))))
	}
	if errs := scoreConcurrently(t, pools, calls); len(errs) > 0 {
		t.Fatal(errs[0])
	}
	ooms := -calOOMs
	for _, e := range engines {
		ooms += e.oomCount()
	}
	for i, p := range pools {
		st := p.Stats()
		if st.Devices[0].Degraded || st.Devices[0].Batches == 0 || len(st.Devices) != 1 {
			t.Errorf("pool %d: %+v, want its GPU in use and no fallback", i, st)
		}
		t.Logf("pool %d: %d batches, %.1f pairs each, %d refusals, %d splits", i, st.Batches, float64(st.Pairs)/float64(st.Batches), st.Refusals, st.Splits)
	}
	if ooms != 0 {
		t.Errorf("%d OOMs after start", ooms)
	}
	for i, e := range engines {
		if own, budget := e.ownPeak(), share.Of(total); own > budget {
			t.Errorf("scorer %d held %d MiB at most (weights, arena, CUDA's own), over its %d MiB share", i, own>>20, budget>>20)
		}
	}
	if limit := uint64(total) / 10 * 9; dev.maxUsed > limit {
		t.Errorf("device peak %d MiB, over the %d MiB the two may use", dev.maxUsed>>20, limit>>20)
	}
	t.Logf("device peak %d of %d MiB", dev.maxUsed>>20, uint64(total)>>20)
}

// neighbourEngine is an arenaEngine on a GPU where another process
// allocates and later frees memory while we calibrate: during given runs
// (counted from 1) it takes or returns bytes.
type neighbourEngine struct {
	*arenaEngine
	mu     sync.Mutex
	runs   int
	events map[int]int64 // run number → bytes the neighbour allocates (<0: frees)
}

func (e *neighbourEngine) ScorePairs(ctx context.Context, pairs []model.Pair) ([]float32, error) {
	e.mu.Lock()
	e.runs++
	if n, ok := e.events[e.runs]; ok {
		if n > 0 {
			e.dev.alloc(uint64(n))
		} else {
			e.dev.free(uint64(-n))
		}
	}
	e.mu.Unlock()
	return e.arenaEngine.ScorePairs(ctx, pairs)
}

// A neighbour's allocations and frees during our calibration (device-wide
// readings: NVML cannot list our PID in a container) do not skew the fit.
func TestCalibrationIgnoresNeighbour(t *testing.T) {
	for _, events := range []map[int]int64{
		{4: 3 << 30, 14: -(3 << 30)},             // a burst that comes and goes
		{3: 2 << 30, 9: -(2 << 30), 20: 1 << 30}, // several
	} {
		dev := &fakeDevice{total: 80 << 30}
		factory := func(Device) (Engine, error) {
			e, err := newArenaEngine(dev, deberta, 0)
			return &neighbourEngine{arenaEngine: e, events: events}, err
		}
		p, err := New(testCtx(t), factory, Mode(ModeCUDA), WithProbe(deviceProbe{dev}), MaxBatchTokens(16384))
		if err != nil {
			t.Fatal(err)
		}
		est := p.devices[0].est
		p.Close(context.Background())
		wantC := float64(deberta.heads) * deberta.perScore
		if rel(est.perToken, deberta.perToken) > 0.05 || rel(est.perTokenLen, wantC) > 0.05 {
			t.Errorf("neighbour events %v: fit per token %.4g (want %.4g), per token·len %.4g (want %.4g)",
				events, est.perToken, deberta.perToken, est.perTokenLen, wantC)
		}
	}
}

// Admission counts what CUDA takes beside the weights and the arena: an
// engine that can empty its arena gets it measured after its two workers
// ran at once (context plus a workspace each), one that cannot gets the
// DefaultGPUMemMargin floor, at least the 764 MiB the first GPU run
// measured. A batch that fits the share beside the weights alone, but not
// beside CUDA's memory too, is refused, as the arena cap would fail it.
func TestAdmissionCountsMemoryBesideArena(t *testing.T) {
	if DefaultGPUMemMargin < 764<<20 {
		t.Fatalf("DefaultGPUMemMargin %d MiB, below the 764 MiB measured on an H200", DefaultGPUMemMargin>>20)
	}
	dev := &fakeDevice{total: 16 << 30}
	share := MemLimit{Fraction: 0.45}
	factory := func(Device) (Engine, error) { return newArenaEngine(dev, deberta, 0) }
	p, err := New(testCtx(t), factory, Mode(ModeCUDA), WithProbe(deviceProbe{dev}), MemFraction(0.9), GPUMemLimit(share),
		CPUFallback(false))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close(context.Background())
	st := p.Stats().Devices[0]
	want := float64(deberta.context + 2*deberta.stream)
	if !st.BesideArenaMeasured || st.BesideArenaBytes < want || st.BesideArenaBytes > want+2*arenaChunk {
		t.Fatalf("beside the arena: %.0f MiB (measured %v), want the %.0f MiB two workers' runs took",
			st.BesideArenaBytes/(1<<20), st.BesideArenaMeasured, want/(1<<20))
	}
	d := p.devices[0]
	budget := float64(share.Of(dev.total))
	rows := d.est.maxRows(512, budget-float64(d.est.weights)-float64(p.cfg.headroom))
	if a := p.admit(d, rows, 512); a.ok {
		t.Errorf("%d×512 (%.0f MiB) beside %d MiB of weights and %.0f MiB of CUDA's own, in a %.0f MiB share: admitted (%s)",
			rows, a.est/(1<<20), d.est.weights>>20, d.est.beside/(1<<20), budget/(1<<20), a.reason)
	}

	unmeasured := newPool(t, newFakeFactory(nil), Mode(ModeCUDA), WithProbe(newFakeProbe(&fakeGPU{total: 16 << 30})))
	if st := unmeasured.Stats().Devices[0]; st.BesideArenaMeasured || st.BesideArenaBytes != DefaultGPUMemMargin {
		t.Errorf("engine that cannot empty its arena: beside %.0f MiB (measured %v), want the %d MiB floor",
			st.BesideArenaBytes/(1<<20), st.BesideArenaMeasured, DefaultGPUMemMargin>>20)
	}
}
