package gpupool

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

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
			if !est.Calibrated || rel(est.PerToken, mem.perToken) > 0.05 || rel(est.PerTokenLen, wantC) > 0.05 ||
				math.Abs(est.PerRow-mem.perRow) > 0.1*mem.perRow+64<<10 {
				t.Fatalf("fit base %.3g, per row %.4g (want %.4g), per token %.4g (want %.4g), per token·len %.4g (want %.4g)",
					est.Base, est.PerRow, mem.perRow, est.PerToken, mem.perToken, est.PerTokenLen, wantC)
			}
			fitted[tc.name] = est.PerTokenLen
			if est.WeightBytes != mem.weights {
				t.Errorf("weights %d, want %d", est.WeightBytes, mem.weights)
			}
			// Every shape is covered with the margin, and no shape is
			// overcharged by more than the margin plus chunk rounding.
			for _, s := range []Shape{{1, 8}, {256, 64}, {128, 128}, {64, 256}, {32, 512}, {8, 512}} {
				truth := float64(mem.footprint(s.Rows, s.Len))
				got := est.Bytes(s.Rows, s.Len)
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
		bestBatches += len(planBatches(c, 32768, 256, 32768/32, truth, nil))
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

// TestFitMemoryPolicies: the CPU's fit (one-row shapes, unweighted) through
// the one solver recovers an exact plane, falls back to the line when the
// points bend down (negative c), to a + c·rows·len² when the linear term
// comes out negative, and refuses readings that do not grow.
func TestFitMemoryPolicies(t *testing.T) {
	lens := []int{32, 64, 128, 256, 512}
	pts := func(f func(l float64) float64) []memPoint {
		var out []memPoint
		for _, l := range lens {
			out = append(out, memPoint{rows: 1, length: l, bytes: f(float64(l))})
		}
		return out
	}
	tests := []struct {
		name    string
		pts     []memPoint
		ok      bool
		a, b, c float64
	}{
		{"plane", pts(func(l float64) float64 { return 5e6 + 3e4*l + 20*l*l }), true, 5e6, 3e4, 20},
		{"line", pts(func(l float64) float64 { return 1e6 + 4e4*l }), true, 1e6, 4e4, 0},
		{"bends down", pts(func(l float64) float64 { return 1e6 + 4e4*l - 10*l*l }), true, 0, 0, 0},
		{"len² only", pts(func(l float64) float64 { return 2e6 + 30*l*l - 500*l }), true, 0, 0, 0},
		{"flat", pts(func(float64) float64 { return 1e6 }), false, 0, 0, 0},
		{"one point", []memPoint{{rows: 1, length: 32, bytes: 1e6}}, false, 0, 0, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e, ok := fitMemory(tc.pts)
			if ok != tc.ok {
				t.Fatalf("ok = %v, want %v (%+v)", ok, tc.ok, e)
			}
			if !ok {
				return
			}
			if e.PerRow != 0 || e.PerToken < 0 || e.PerTokenLen < 0 || (e.PerToken == 0 && e.PerTokenLen == 0) {
				t.Fatalf("fit %+v: want non-negative growth terms, no per-row term", e)
			}
			switch tc.name {
			case "bends down":
				if e.PerTokenLen != 0 || e.PerToken <= 0 {
					t.Errorf("fit %+v: want the line", e)
				}
			case "len² only":
				if e.PerToken != 0 || e.PerTokenLen <= 0 {
					t.Errorf("fit %+v: want a + c·rows·len²", e)
				}
			default:
				if rel(e.Base, tc.a) > 1e-6 || rel(e.PerToken, tc.b) > 1e-6 || rel(e.PerTokenLen, tc.c) > 1e-6 {
					t.Errorf("fit %+v, want a=%g b=%g c=%g", e, tc.a, tc.b, tc.c)
				}
			}
		})
	}
}
