package gpupool

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/scorer/scorer/model"
)

// fakeEngine is a scriptable Engine. Its score for a pair is the pair's
// first ID, so tests can check results land at the right index.
type fakeEngine struct {
	dev     Device
	delay   time.Duration
	oomOver int           // rows above this fail with model.ErrOutOfMemory (0: never)
	err     error         // every call fails with it
	gate    chan struct{} // if set, each call waits for it (or ctx)
	hang    chan struct{} // if set, each call waits for it, ignoring ctx (a Run that will not terminate)
	onRun   func(rows, maxLen int)
	// maxLength is what MaxLength reports (0: unknown).
	maxLength int

	mu      sync.Mutex
	calls   int
	okRows  []int // rows of each successful call
	maxRows int   // most rows run successfully at once
	running int
	closed  bool
}

var errFakeCUDA = errors.New("fake: CUDA failure: an illegal memory access was encountered")

func (e *fakeEngine) ScorePairs(ctx context.Context, pairs []model.Pair) ([]float32, error) {
	e.mu.Lock()
	e.calls++
	e.running++
	closed := e.closed
	e.mu.Unlock()
	defer func() {
		e.mu.Lock()
		e.running--
		e.mu.Unlock()
	}()
	if closed {
		return nil, errors.New("fake: engine used after Close")
	}
	if e.gate != nil {
		select {
		case <-e.gate:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	if e.hang != nil {
		<-e.hang
	}
	if e.delay > 0 {
		t := time.NewTimer(e.delay)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		}
	}
	if e.err != nil {
		return nil, e.err
	}
	if e.oomOver > 0 && len(pairs) > e.oomOver {
		return nil, fmt.Errorf("fake: %d rows: %w", len(pairs), model.ErrOutOfMemory)
	}
	maxLen := 0
	out := make([]float32, len(pairs))
	for i, p := range pairs {
		maxLen = max(maxLen, p.Len())
		if p.Len() > 0 {
			out[i] = float32(p.IDs[0])
		}
	}
	if e.onRun != nil {
		e.onRun(len(pairs), maxLen)
	}
	e.mu.Lock()
	e.okRows = append(e.okRows, len(pairs))
	e.maxRows = max(e.maxRows, len(pairs))
	e.mu.Unlock()
	return out, nil
}

// MaxLength reports the longest pair the engine accepts, as model.Session's
// model does; the pool validates pairs against it.
func (e *fakeEngine) MaxLength() int { return e.maxLength }

func (e *fakeEngine) Close() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return errors.New("fake: closed twice")
	}
	e.closed = true
	return nil
}

func (e *fakeEngine) snapshot() (calls int, okRows []int, maxRows int, closed bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.calls, append([]int(nil), e.okRows...), e.maxRows, e.closed
}

// fakeFactory hands out engines per device: engines[label] if present,
// else a fresh default engine, and remembers every engine it made.
type fakeFactory struct {
	mu      sync.Mutex
	engines map[string]*fakeEngine
	made    []*fakeEngine
	failFor map[string]error
}

func newFakeFactory(engines map[string]*fakeEngine) *fakeFactory {
	if engines == nil {
		engines = map[string]*fakeEngine{}
	}
	return &fakeFactory{engines: engines, failFor: map[string]error{}}
}

func (f *fakeFactory) factory(dev Device) (Engine, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.failFor[dev.Label()]; err != nil {
		return nil, err
	}
	e, ok := f.engines[dev.Label()]
	if !ok {
		e = &fakeEngine{}
		f.engines[dev.Label()] = e
	}
	e.dev = dev
	f.made = append(f.made, e)
	return e, nil
}

func (f *fakeFactory) engine(label string) *fakeEngine {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.engines[label]
}

// fakeGPU is one device a fakeProbe reports.
type fakeGPU struct {
	total, used uint64
	util        uint32
	throttle    uint64
	memErr      error
}

// fakeProbe is a scriptable Probe.
type fakeProbe struct {
	mu   sync.Mutex
	gpus []*fakeGPU
	err  error // Devices fails with it
}

func newFakeProbe(gpus ...*fakeGPU) *fakeProbe { return &fakeProbe{gpus: gpus} }

func (p *fakeProbe) Devices() ([]DeviceInfo, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.err != nil {
		return nil, p.err
	}
	out := make([]DeviceInfo, len(p.gpus))
	for i, g := range p.gpus {
		out[i] = DeviceInfo{Index: i, UUID: fmt.Sprintf("GPU-fake-%d", i), Name: "Fake GPU", TotalMemory: g.total}
	}
	return out, nil
}

func (p *fakeProbe) MemoryInfo(idx int) (free, used, total uint64, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	g := p.gpus[idx]
	if g.memErr != nil {
		return 0, 0, 0, g.memErr
	}
	return g.total - g.used, g.used, g.total, nil
}

func (p *fakeProbe) Utilization(idx int) (uint32, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.gpus[idx].util, nil
}

func (p *fakeProbe) Throttled(idx int) (uint64, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.gpus[idx].throttle, nil
}

// gateProbe is a fakeProbe whose MemoryInfo, once armed, reports each call
// on entered and then waits for the release: a test can act while a worker
// is inside admission control.
type gateProbe struct {
	*fakeProbe
	entered chan struct{} // buffered 1; one send per gated call, dropped when full

	gmu  sync.Mutex
	gate chan struct{} // nil: MemoryInfo passes straight through
}

func newGateProbe(gpus ...*fakeGPU) *gateProbe {
	return &gateProbe{fakeProbe: newFakeProbe(gpus...), entered: make(chan struct{}, 1)}
}

// arm gates MemoryInfo from now on; release lets every gated call through
// and disarms the gate.
func (p *gateProbe) arm() (release func()) {
	ch := make(chan struct{})
	p.gmu.Lock()
	p.gate = ch
	p.gmu.Unlock()
	return sync.OnceFunc(func() {
		p.gmu.Lock()
		p.gate = nil
		p.gmu.Unlock()
		close(ch)
	})
}

func (p *gateProbe) MemoryInfo(idx int) (free, used, total uint64, err error) {
	p.gmu.Lock()
	g := p.gate
	p.gmu.Unlock()
	if g != nil {
		select {
		case p.entered <- struct{}{}:
		default:
		}
		<-g
	}
	return p.fakeProbe.MemoryInfo(idx)
}

func (p *fakeProbe) set(idx int, fn func(g *fakeGPU)) {
	p.mu.Lock()
	defer p.mu.Unlock()
	fn(p.gpus[idx])
}

// makePairs builds pairs of the given lengths; pair i's IDs start with
// 1000+i so a fake engine's score identifies it.
func makePairs(lens []int) []model.Pair {
	out := make([]model.Pair, len(lens))
	for i, l := range lens {
		ids := make([]int32, l)
		for j := range ids {
			ids[j] = int32(1000 + i)
		}
		out[i] = model.Pair{IDs: ids, TypeIDs: make([]int32, l)}
	}
	return out
}

// checkScores asserts scores are makePairs' identities in input order.
func checkScores(pairs []model.Pair, scores []float32) error {
	if len(scores) != len(pairs) {
		return fmt.Errorf("got %d scores for %d pairs", len(scores), len(pairs))
	}
	for i, s := range scores {
		if want := float32(pairs[i].IDs[0]); s != want {
			return fmt.Errorf("score[%d] = %v, want %v", i, s, want)
		}
	}
	return nil
}

// mustScore scores pairs through p and fails the test unless every pair got
// its own score back, in input order.
func mustScore(t *testing.T, p *Pool, pairs []model.Pair) {
	t.Helper()
	scores, err := p.ScorePairs(testCtx(t), pairs)
	if err != nil {
		t.Fatal(err)
	}
	if err := checkScores(pairs, scores); err != nil {
		t.Fatal(err)
	}
}

// scoreConcurrently scores every call at once, call i on pools[i%len(pools)],
// and returns what failed: a call's error, or scores not in input order.
func scoreConcurrently(t *testing.T, pools []*Pool, calls [][]model.Pair) []error {
	var wg sync.WaitGroup
	errs := make(chan error, len(calls))
	for i, pairs := range calls {
		p := pools[i%len(pools)]
		wg.Add(1)
		go func() {
			defer wg.Done()
			scores, err := p.ScorePairs(testCtx(t), pairs)
			if err == nil {
				err = checkScores(pairs, scores)
			}
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	var failed []error
	for err := range errs {
		if err != nil {
			failed = append(failed, err)
		}
	}
	return failed
}

// arenaGrowth returns an onRun hook for a fake engine whose ORT arena grows
// to the largest batch it has run (base + perToken × rows × length) and
// keeps it, reporting each growth in bytes to grow.
func arenaGrowth(base, perToken int, grow func(bytes uint64)) func(rows, maxLen int) {
	var mu sync.Mutex
	peak := 0
	return func(rows, maxLen int) {
		mu.Lock()
		defer mu.Unlock()
		if need := base + perToken*rows*maxLen; need > peak {
			grow(uint64(need - peak))
			peak = need
		}
	}
}
