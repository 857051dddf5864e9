package gpupool

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/scorer/scorer/gpupool/hostcheck"
	"github.com/scorer/scorer/model"
)

// ErrPoolClosed is returned by ScorePairs once Close has begun, and fails
// work that a Close whose ctx expired abandoned.
var ErrPoolClosed = errors.New("gpupool: pool closed")

// ErrCloseIncomplete is returned (wrapping ctx's error) by a Close whose ctx
// ended and whose cancelled runs had still not returned after a further
// grace period: workers may still be inside an engine or an NVML call, and
// the engines are not closed yet. The caller must then not unload ONNX
// Runtime or NVML (dlclose) nor free what the engines use; a later Close
// waits for the rest.
var ErrCloseIncomplete = errors.New("gpupool: close incomplete: runs still going, engines not closed")

// ErrInvalidInput marks a call no engine could ever run: an empty pair,
// type IDs that do not match the IDs, or a pair longer than the model
// accepts. ScorePairs checks pairs up front and fails such a call at once;
// an engine error wrapping it also fails the call without counting against
// the device. The failure is permanent: retrying the same pairs fails again,
// and the error says so with a Permanent method, the convention callers such
// as the consumer use to tell bad input from an outage without importing us.
var ErrInvalidInput error = permanentError("gpupool: invalid input")

// permanentError is a sentinel whose failure no retry can fix.
type permanentError string

func (e permanentError) Error() string { return string(e) }

// Permanent reports that retrying the same input cannot succeed.
func (permanentError) Permanent() bool { return true }

// defaultCloseGrace is how long a Close whose ctx ended still waits for the
// cancelled runs to return and the engines to close.
const defaultCloseGrace = 5 * time.Second

// defaultStuckAfter is the least time a device keeps refusing a one-pair
// batch (with at least stuckRefusals refusals) before the batch moves off it.
const defaultStuckAfter = 30 * time.Second

// Pool schedules pair scoring over a set of devices. It is safe for
// concurrent use. Create it with New and stop it with Close; a closed pool
// cannot be reused.
type Pool struct {
	cfg     cfg
	factory EngineFactory
	log     zerolog.Logger
	m       *metrics

	probe         Probe
	probeShutdown func() // nil when the caller owns the probe
	// sigGuard holds SIGINT/SIGTERM handlers from before CUDA init; any
	// that changed are restored after every GPU run, since CUDA may install
	// handlers lazily on a later run.
	sigGuard *signalGuard

	// abortCtx ends when Close's ctx expires: running batches are cancelled
	// and workers stop without draining.
	abortCtx context.Context
	abort    context.CancelFunc

	wg          sync.WaitGroup // workers and probation timers
	closing     chan struct{}  // closed when Close begins: probations stop
	closeOnce   sync.Once      // starts the closer
	workersDone chan struct{}  // closed after workers exit and engines close
	closeErr    error          // engine/probe close errors, set before workersDone closes

	mu       sync.Mutex
	queue    *queue // batches waiting for a worker
	admitted int    // pairs queued or running: the QueueCapacity bound
	inflight int    // batches taken by workers and not yet settled
	// running holds when each batch on an engine right now began its run,
	// for Stats.OldestRun.
	running     map[*batch]time.Time
	closed      bool
	devices     []*device
	creatingCPU bool          // a worker is creating the fallback CPU engine
	work        chan struct{} // closed and replaced to wake workers
	space       chan struct{} // closed and replaced to wake callers waiting for capacity
	stats       Stats

	// maxPairLen is the longest pair the engines accept (0: unknown); set
	// by New before any call.
	maxPairLen int
	// closeGrace bounds Close's wait for cancelled runs once its ctx ended;
	// set by New (tests shorten it before Close).
	closeGrace time.Duration
	// stuckAfter is how long a one-pair batch may be refused on a device
	// before it moves off it; guarded by mu (tests shorten it).
	stuckAfter time.Duration
}

// request is one ScorePairs call.
type request struct {
	ctx       context.Context
	pairs     []model.Pair
	out       []float32
	remaining int           // pairs not yet scored; guarded by Pool.mu
	finished  bool          // done is closed; guarded by Pool.mu
	err       error         // set before done closes
	done      chan struct{} // closed when every pair is scored or the call failed
}

// batch is a set of a request's pairs run together.
type batch struct {
	req      *request
	idx      []int // indices into req.pairs, shortest first
	attempts int   // failed runs of this batch and the batches it was split from
	refusals int   // admission refusals since it was last split or moved
	avoid    []int // device slots this batch must not run on again
	lastErr  error // the latest run failure, for the error a failed call gets
	// refusedSince is its first refusal since it was last split or moved.
	refusedSince time.Time
}

// device is one execution device with its engine and workers.
type device struct {
	slot     int
	dev      Device
	engine   Engine
	workers  int
	fallback bool // lazily created CPU engine
	est      memEstimate
	// cpu is a CPU device's memory budget (CPUMemory); nil: none.
	cpu *cpuBudget

	// Guarded by Pool.mu.
	degraded bool
	failures int // consecutive failed runs
	hot      bool
	reserved float64 // memory estimates of admitted batches running now
	// arenaPeak is the most memory our runs have needed at once on this
	// device: what ORT's arena may hold and reuse.
	arenaPeak float64
	batches   uint64
	pairs     uint64
}

// Stats is a snapshot of the pool's counters, kept so a benchmark can read
// batching and padding efficiency without scraping Prometheus.
type Stats struct {
	// Batches and Pairs count completed inference batches and their pairs.
	Batches, Pairs uint64
	// RealTokens and PaddedTokens sum the pairs' lengths and rows × longest
	// length over completed batches; their ratio is padding efficiency.
	RealTokens, PaddedTokens uint64
	// Splits counts batches split in two (after OOM, errors or refusals).
	Splits uint64
	// OOMRetries counts runs that failed for lack of memory.
	OOMRetries uint64
	// RunErrors counts runs that failed for any other reason.
	RunErrors uint64
	// Refusals counts GPU admission refusals.
	Refusals uint64
	// Fallbacks counts lazily created CPU engines.
	Fallbacks uint64
	// Dropped counts queued batches discarded because their call had
	// already ended (cancelled or failed).
	Dropped uint64
	// QueuedPairs is the pairs waiting now; InFlightBatches the batches
	// running now.
	QueuedPairs, InFlightBatches int
	// OldestRun is how long the longest engine run going on now has taken
	// so far (0: none). Each run is one batch, bounded by the batch caps,
	// so a run far longer than a batch takes is hung (a driver call or a
	// run that ignores cancellation), while the other devices may go on.
	OldestRun time.Duration
	// Devices has one entry per device, fallback included.
	Devices []DeviceStats
}

// DeviceStats is one device's share of the work and its health.
type DeviceStats struct {
	Device Device
	// Workers is how many workers pull batches for this device.
	Workers        int
	Batches, Pairs uint64
	Degraded, Hot  bool
	Fallback       bool
	// EstimateBase, EstimatePerRow, EstimatePerToken and
	// EstimatePerTokenLen are the calibrated memory model bytes ≈ base +
	// perRow·rows + perToken·rows·len + perTokenLen·rows·len² (zero on a
	// CPU without CPUMemory), before the margins EstimateBytes adds.
	EstimateBase, EstimatePerRow, EstimatePerToken, EstimatePerTokenLen float64
	// EstimateHeldOut is the GPU fit's largest relative under-prediction of
	// a calibration shape left out of it, added to every estimate.
	EstimateHeldOut float64
	// WeightBytes is what opening a GPU's engine took (its weights, and
	// the CUDA context where readings are per process). BesideArenaBytes is
	// what its admission counts beside that and the arena (the context's
	// growth, each worker's workspace): measured once every worker has run
	// when BesideArenaMeasured, else DefaultGPUMemMargin.
	WeightBytes         uint64
	BesideArenaBytes    float64
	BesideArenaMeasured bool
	// BatchBytes is the most modelled memory one CPU batch may take and
	// BaselineBytes the resident memory once the CPU engine was open and
	// calibrated (both zero without CPUMemory).
	BatchBytes, BaselineBytes float64

	est memEstimate
}

// EstimateBytes is what admission reserves on this device for a batch of
// rows pairs padded to length tokens: the memory model with its margins,
// beyond the weights and BesideArenaBytes.
func (s DeviceStats) EstimateBytes(rows, length int) float64 { return s.est.bytes(rows, length) }

// MaxRows is the most rows of length tokens whose EstimateBytes fits in
// room bytes (0: not one).
func (s DeviceStats) MaxRows(length int, room float64) int { return s.est.maxRows(length, room) }

// PaddingEfficiency is RealTokens / PaddedTokens: 1 means no padding.
func (s Stats) PaddingEfficiency() float64 {
	if s.PaddedTokens == 0 {
		return 0
	}
	return float64(s.RealTokens) / float64(s.PaddedTokens)
}

// New builds a pool: it validates the options, finds the devices for the
// mode, opens one engine per device through factory, calibrates GPU memory
// and starts the workers. In auto mode a machine without a usable GPU gets a
// CPU pool and one warning naming the reason; in cuda mode it gets an error.
// ctx bounds only the start (NVML init, calibration), not the pool's life.
func New(ctx context.Context, factory EngineFactory, opts ...Option) (*Pool, error) {
	if factory == nil {
		return nil, errors.New("gpupool: nil EngineFactory")
	}
	c := defaultCfg()
	for _, o := range opts {
		o.apply(&c)
	}
	if err := c.validate(); err != nil {
		return nil, err
	}
	m, err := newMetrics(c.reg)
	if err != nil {
		return nil, err
	}
	p := &Pool{
		cfg:         c,
		factory:     factory,
		log:         c.logger,
		m:           m,
		workersDone: make(chan struct{}),
		closing:     make(chan struct{}),
		work:        make(chan struct{}),
		space:       make(chan struct{}),
		closeGrace:  defaultCloseGrace,
		stuckAfter:  defaultStuckAfter,
		running:     map[*batch]time.Time{},
		queue:       newQueue(m.queueDepth),
	}
	p.abortCtx, p.abort = context.WithCancel(context.Background())
	if err := p.openDevices(ctx); err != nil {
		p.abort()
		return nil, err
	}
	for _, d := range p.devices {
		if n := engineMaxLength(d.engine); n > 0 && (p.maxPairLen == 0 || n < p.maxPairLen) {
			p.maxPairLen = n
		}
	}
	for _, d := range p.devices {
		p.startWorkersLocked(d)
	}
	return p, nil
}

// engineMaxLength is the longest pair e accepts, in tokens, or 0 when e
// does not say. model.Session says through its Model; other engines may
// implement MaxLength() int.
func engineMaxLength(e Engine) int {
	switch e := e.(type) {
	case interface{ MaxLength() int }:
		return e.MaxLength()
	case interface{ Model() *model.Model }:
		if m := e.Model(); m != nil {
			return m.MaxLength
		}
	}
	return 0
}

// openDevices fills p.devices according to the mode.
func (p *Pool) openDevices(ctx context.Context) error {
	if p.cfg.mode == ModeCPU {
		return p.openCPU(ctx, false)
	}
	reason := p.openGPUs(ctx)
	if len(p.devices) > 0 {
		return nil
	}
	if p.probeShutdown != nil {
		p.probeShutdown()
		p.probeShutdown = nil
	}
	if p.cfg.mode == ModeCUDA {
		if pr, ok := hostcheck.DiagnoseCUDA(reason); ok {
			// The cause and its remedy lead, so the one line a failed start
			// leaves says what to do; the details follow.
			return fmt.Errorf("gpupool: mode cuda but no GPU works: %s; remedy: %s: %w", pr.Cause, pr.Remedy, reason)
		}
		return fmt.Errorf("gpupool: mode cuda but no GPU works: %w", reason)
	}
	ev := p.log.Warn().Err(reason)
	if pr, ok := hostcheck.DiagnoseCUDA(reason); ok {
		ev = ev.Str("problem", pr.Kind).Str("cause", pr.Cause).Str("remedy", pr.Remedy)
	}
	ev.Msg("gpupool: no usable GPU, scoring on CPU")
	return p.openCPU(ctx, false)
}

// openCPU opens the CPU engine. The pool's own CPU device (not a lazily
// created fallback, which must start at once) takes CPUBatchShape and is
// calibrated when CPUMemory is set.
func (p *Pool) openCPU(ctx context.Context, fallback bool) error {
	if !fallback {
		// The pool runs on the CPU for good: its batches take the CPU shape
		// from here on, the memory calibration's reference batch included.
		if t := p.cfg.cpuBatchTokens; t > 0 {
			p.cfg.maxBatchTokens = min(p.cfg.maxBatchTokens, t)
		}
		if r := p.cfg.cpuBatchRows; r > 0 {
			p.cfg.maxBatchRows = min(p.cfg.maxBatchRows, r)
		}
	}
	dev := Device{Kind: CPU, Name: "cpu"}
	eng, err := p.factory(dev)
	if err != nil {
		return fmt.Errorf("gpupool: opening CPU engine: %w", err)
	}
	var est memEstimate
	var bud *cpuBudget
	if p.cfg.cpuMem != nil && !fallback {
		mem := p.cfg.procMem
		if mem == nil {
			mem = defaultProcessMemory()
		}
		t0 := time.Now()
		if est, bud, err = p.calibrateCPU(ctx, eng, mem, p.workersFor(dev)); err != nil {
			_ = eng.Close()
			return err
		}
		if bud != nil {
			p.log.Info().Float64("estimate_base_bytes", est.base).Float64("estimate_bytes_per_token", est.perToken).
				Float64("estimate_bytes_per_token_len", est.perTokenLen).Uint64("limit_bytes", p.cfg.cpuMem.Limit).
				Uint64("baseline_bytes", bud.baseline).Uint64("reserve_bytes", p.cfg.cpuMem.Reserve).
				Int("workers", p.workersFor(dev)).Float64("batch_bytes", bud.room).Dur("took", time.Since(t0)).
				Msg("gpupool: cpu: memory calibrated; batches are cut to batch_bytes each")
		}
	}
	d := p.addDeviceLocked(dev, eng, est, fallback)
	d.cpu = bud
	return nil
}

// workersFor is how many workers pull batches for dev.
func (p *Pool) workersFor(dev Device) int {
	w := p.cfg.workersPerDevice
	switch {
	case dev.Kind == CPU && p.cfg.cpuWorkers > 0:
		w = p.cfg.cpuWorkers
	case w == 0 && dev.Kind == CUDA:
		w = 2 // overlap one batch's host work with the other's kernels
	case w == 0:
		w = 1 // the CPU session already spreads one batch over every core
	}
	return w
}

func (p *Pool) addDeviceLocked(dev Device, eng Engine, est memEstimate, fallback bool) *device {
	w := p.workersFor(dev)
	d := &device{slot: len(p.devices), dev: dev, engine: eng, workers: w, fallback: fallback, est: est, arenaPeak: est.arena}
	if dev.Kind == CUDA {
		p.m.gpuDegraded.WithLabelValues(dev.Label()).Set(0) // the series exists before anything goes wrong
	}
	p.devices = append(p.devices, d)
	return d
}

// openGPUs opens every selected GPU whose engine opens and calibrates. It
// returns why no GPU (or some GPU) could not be used.
func (p *Pool) openGPUs(ctx context.Context) error {
	probe := p.cfg.probe
	if probe == nil {
		pr, shutdown, err := NewNVMLProbe(ctx)
		if err != nil {
			return err
		}
		probe, p.probeShutdown = pr, shutdown
	}
	p.probe = probe
	infos, err := probe.Devices()
	if err != nil {
		return err
	}
	infos, err = selectGPUs(infos, p.cfg.gpuIDs)
	if err != nil {
		return err
	}
	if len(infos) == 0 {
		return fmt.Errorf("gpupool: GPU_IDS %v selects no GPU: %w", p.cfg.gpuIDs, ErrNoGPU)
	}
	guard, gerr := saveSignals()
	if gerr != nil {
		p.log.Warn().Err(gerr).Msg("gpupool: cannot save signal handlers before CUDA init")
	}
	p.sigGuard = guard
	var reasons []error
	for _, info := range infos {
		dev := Device{Kind: CUDA, Index: info.Index, UUID: info.UUID, Name: info.Name, TotalMemory: info.TotalMemory}
		_, usedBefore, _, _ := probe.MemoryInfo(info.Index)
		eng, err := p.factory(dev)
		if err != nil {
			reasons = append(reasons, fmt.Errorf("gpupool: %s (%s): opening engine: %w", dev.Label(), dev.UUID, err))
			continue
		}
		est, err := p.calibrate(ctx, dev, eng, usedBefore, p.workersFor(dev))
		if err != nil {
			_ = eng.Close()
			reasons = append(reasons, err)
			continue
		}
		p.log.Info().Str("device", dev.Label()).Str("uuid", dev.UUID).Str("name", dev.Name).
			Uint64("total_bytes", dev.TotalMemory).Uint64("weights_bytes", est.weights).
			Float64("estimate_base_bytes", est.base).Float64("estimate_bytes_per_token", est.perToken).
			Float64("estimate_bytes_per_token_len", est.perTokenLen).Float64("estimate_bytes_per_row", est.perRow).
			Float64("estimate_held_out_error", est.heldOut).Float64("arena_bytes", est.arena).
			Float64("beside_arena_bytes", est.beside).Bool("beside_arena_measured", est.besideMeasured).
			Bool("calibrated", est.calibrated).Msg("gpupool: GPU ready")
		p.addDeviceLocked(dev, eng, est, false)
	}
	// CUDA may have replaced SIGINT/SIGTERM handlers while initialising
	// (onnxruntime_go #140); put Go's back before anything else happens.
	if guard != nil {
		if err := guard.restore(); err != nil {
			p.log.Warn().Err(err).Msg("gpupool: cannot restore signal handlers after CUDA init")
		}
	}
	if p.cfg.afterCUDAInit != nil {
		p.cfg.afterCUDAInit()
	}
	if len(reasons) > 0 && len(p.devices) > 0 {
		p.log.Warn().Err(errors.Join(reasons...)).Msg("gpupool: some GPUs are unusable")
	}
	return errors.Join(reasons...)
}

// selectGPUs keeps the GPUs named in ids (NVML index or UUID); no ids keeps
// all. A name that matches nothing is an error: a typo must not silently
// shrink the pool.
func selectGPUs(infos []DeviceInfo, ids []string) ([]DeviceInfo, error) {
	if len(ids) == 0 {
		return infos, nil
	}
	var out []DeviceInfo
	for _, id := range ids {
		id = strings.TrimSpace(id)
		found := false
		for _, in := range infos {
			if id == strconv.Itoa(in.Index) || strings.EqualFold(id, in.UUID) {
				if !slices.ContainsFunc(out, func(o DeviceInfo) bool { return o.Index == in.Index }) {
					out = append(out, in)
				}
				found = true
			}
		}
		if !found {
			return nil, fmt.Errorf("gpupool: GPU id %q matches no device NVML lists: %w", id, ErrNoGPU)
		}
	}
	return out, nil
}

func (p *Pool) startWorkersLocked(d *device) {
	for i := 0; i < d.workers; i++ {
		p.wg.Add(1)
		go p.worker(d)
	}
}

// closeEngines closes every engine and, if the pool opened NVML, shuts it
// down. It runs once, after every worker has exited.
func (p *Pool) closeEngines() error {
	p.mu.Lock()
	devs := slices.Clone(p.devices)
	p.mu.Unlock()
	var errs []error
	for _, d := range devs {
		if err := d.engine.Close(); err != nil {
			errs = append(errs, fmt.Errorf("gpupool: closing %s engine: %w", d.dev.Label(), err))
		}
	}
	if p.probeShutdown != nil {
		p.probeShutdown()
	}
	return errors.Join(errs...)
}

// Devices lists the pool's devices, a lazily created CPU fallback included.
func (p *Pool) Devices() []Device {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]Device, len(p.devices))
	for i, d := range p.devices {
		out[i] = d.dev
	}
	return out
}

// BatchShape is the token and row caps the pool plans each call's batches
// under: MaxBatchTokens and MaxBatchRows, or the CPUBatchShape caps when
// the pool's own device is the CPU. Fixed once New returns.
func (p *Pool) BatchShape() (tokens, rows int) {
	return p.cfg.maxBatchTokens, p.cfg.maxBatchRows
}

// Stats returns a snapshot of the pool's counters.
func (p *Pool) Stats() Stats {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := p.stats
	s.QueuedPairs = p.queue.pairs
	s.InFlightBatches = p.inflight
	for _, at := range p.running {
		s.OldestRun = max(s.OldestRun, time.Since(at))
	}
	s.Devices = make([]DeviceStats, len(p.devices))
	for i, d := range p.devices {
		s.Devices[i] = DeviceStats{Device: d.dev, Workers: d.workers, Batches: d.batches, Pairs: d.pairs, Degraded: d.degraded,
			Hot: d.hot, Fallback: d.fallback, EstimateBase: d.est.base, EstimatePerRow: d.est.perRow,
			EstimatePerToken: d.est.perToken, EstimatePerTokenLen: d.est.perTokenLen, EstimateHeldOut: d.est.heldOut,
			WeightBytes: d.est.weights, BesideArenaBytes: d.est.beside, BesideArenaMeasured: d.est.besideMeasured, est: d.est}
		if d.cpu != nil {
			s.Devices[i].BatchBytes, s.Devices[i].BaselineBytes = d.cpu.room, float64(d.cpu.baseline)
		}
	}
	return s
}

// ScorePairs scores pairs and returns one score per pair in input order; it
// implements model.PairScorer. The pairs are sorted by length and packed
// into batches under MaxBatchTokens and MaxBatchRows, queued, and run by
// whichever device workers are idle. While the pool holds its queue
// capacity (32768 pairs queued or running), ScorePairs waits for room. When ctx ends, the call's queued batches
// are removed and its running ones cancelled, and ctx's error is returned.
// After Close it returns ErrPoolClosed. Pairs no engine could run (empty,
// type IDs not matching IDs, longer than the model's maximum length) fail
// the call at once with ErrInvalidInput, before anything is queued. Every
// pair is scored or the call fails: a batch is never silently dropped.
func (p *Pool) ScorePairs(ctx context.Context, pairs []model.Pair) ([]float32, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	p.mu.Lock()
	closed := p.closed
	p.mu.Unlock()
	if closed {
		return nil, ErrPoolClosed
	}
	if err := validatePairs(pairs, p.maxPairLen); err != nil {
		return nil, err
	}
	if len(pairs) == 0 {
		return []float32{}, nil
	}
	req := &request{ctx: ctx, pairs: pairs, out: make([]float32, len(pairs)), remaining: len(pairs), done: make(chan struct{})}
	// The planner counts one more batch as costing a 32nd of the token
	// budget in padding, of the shape the pool runs: it then cuts each
	// call's length-sorted pairs into few, nearly unpadded batches.
	overhead := max(1, p.cfg.maxBatchTokens/32)
	for _, idx := range planBatches(pairs, p.cfg.maxBatchTokens, p.cfg.maxBatchRows, overhead, p.rowCapFunc()) {
		if err := p.enqueue(req, &batch{req: req, idx: idx}); err != nil {
			return nil, err
		}
	}
	select {
	case <-req.done:
	case <-ctx.Done():
		p.mu.Lock()
		p.failLocked(req, ctx.Err())
		p.mu.Unlock()
		<-req.done // closed by failLocked or just before it
	}
	if req.err != nil {
		return nil, req.err
	}
	return req.out, nil
}

// rowCapFunc returns the most rows of a given length one batch may have so
// that the roomiest device's memory model admits it: on a calibrated GPU,
// an otherwise idle device's room; on a CPU with CPUMemory, one worker's
// share of the budget. The planner cuts long pairs into fewer rows than the
// token budget allows, because attention memory grows with len². It
// snapshots the estimates once per plan. With no such device it is nil (no
// cap beyond rows and tokens).
func (p *Pool) rowCapFunc() func(length int) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	type dev struct {
		est  memEstimate
		room float64
	}
	var devs []dev
	for _, d := range p.devices {
		switch {
		case d.degraded:
		case d.dev.Kind == CUDA && d.est.calibrated:
			devs = append(devs, dev{d.est, p.budgetLocked(d) - float64(d.est.weights) - d.est.beside - float64(p.cfg.headroom)})
		case d.dev.Kind == CPU && d.cpu != nil:
			devs = append(devs, dev{d.est, d.cpu.room})
		}
	}
	if len(devs) == 0 {
		return nil
	}
	return func(length int) int {
		best := 1
		for _, d := range devs {
			best = max(best, d.est.maxRows(length, d.room))
		}
		return best
	}
}

// validatePairs rejects, with ErrInvalidInput, what every engine would
// reject (the same checks as model.Session's), so such a call fails at once
// instead of walking across the devices as if they were broken. maxLen 0
// skips the length check.
func validatePairs(pairs []model.Pair, maxLen int) error {
	for i, pr := range pairs {
		switch {
		case len(pr.IDs) == 0:
			return fmt.Errorf("%w: pair %d is empty", ErrInvalidInput, i)
		case pr.TypeIDs != nil && len(pr.TypeIDs) != len(pr.IDs):
			return fmt.Errorf("%w: pair %d has %d ids but %d type ids", ErrInvalidInput, i, len(pr.IDs), len(pr.TypeIDs))
		case maxLen > 0 && len(pr.IDs) > maxLen:
			return fmt.Errorf("%w: pair %d has %d tokens, max length is %d", ErrInvalidInput, i, len(pr.IDs), maxLen)
		}
	}
	return nil
}

// isInvalidInput reports whether an engine's error says the input itself is
// bad, which no retry or other device can fix.
func isInvalidInput(err error) bool {
	return errors.Is(err, ErrInvalidInput) || errors.Is(err, model.ErrInvalidInput)
}

// enqueue adds b at the back of the queue, waiting while the pool is full.
// On ctx's end or Close it fails the whole request and returns the reason.
func (p *Pool) enqueue(req *request, b *batch) error {
	n := len(b.idx)
	p.mu.Lock()
	defer p.mu.Unlock()
	for {
		if req.finished {
			return req.err
		}
		if p.closed {
			p.failLocked(req, ErrPoolClosed)
			return ErrPoolClosed
		}
		if p.admitted+n <= p.cfg.queueCapacity {
			break
		}
		space := p.space
		p.mu.Unlock()
		select {
		case <-space:
		case <-req.ctx.Done():
		}
		p.mu.Lock()
		if err := req.ctx.Err(); err != nil {
			p.failLocked(req, err)
			return err
		}
	}
	p.admitted += n
	p.pushLocked(b, false)
	// Every device may already be degraded: fail or fall back now rather
	// than leave the batch to wait for nobody.
	p.reconcileLocked()
	return nil
}

// pushLocked queues b: at the back for new work, at the front for retries,
// which already waited their turn once.
func (p *Pool) pushLocked(b *batch, front bool) {
	if front {
		p.queue.pushFront(b)
	} else {
		p.queue.push(b)
	}
	p.wakeWorkersLocked()
}

func (p *Pool) wakeWorkersLocked() {
	close(p.work)
	p.work = make(chan struct{})
}

// releaseLocked returns n pairs of capacity and wakes callers waiting for it.
func (p *Pool) releaseLocked(n int) {
	p.admitted -= n
	close(p.space)
	p.space = make(chan struct{})
}

// failLocked ends req with err (the first error wins), removing its queued
// batches. Its running batches notice req.finished when they return.
func (p *Pool) failLocked(req *request, err error) {
	if req.finished {
		return
	}
	req.finished = true
	req.err = err
	for _, b := range p.queue.remove(func(b *batch) bool { return b.req == req }) {
		p.releaseLocked(len(b.idx))
	}
	close(req.done)
	p.wakeWorkersLocked() // Close may be waiting for an empty queue
}

// Close shuts the pool down like http.Server.Shutdown: it stops taking new
// calls (ScorePairs returns ErrPoolClosed, and callers still waiting for
// queue room fail with it), lets queued and running batches finish, waits
// for the workers, then closes the engines (and NVML, if New opened it).
//
// If ctx ends first, Close cancels running batches and fails queued work
// with ErrPoolClosed, then waits up to 5 s more for the cancelled runs to
// return and the engines to close. If they do, it returns ctx's error
// (joined with any close error): nothing of the pool runs any more. If they
// do not (a run that ignores cancellation, a hung driver call), it returns
// ErrCloseIncomplete wrapping ctx's error: workers may still be inside ONNX
// Runtime or NVML, so the caller must not unload those libraries; the
// engines are closed whenever the runs return. Calling Close again waits
// the same way.
func (p *Pool) Close(ctx context.Context) error {
	p.closeOnce.Do(func() {
		p.mu.Lock()
		p.closed = true
		close(p.closing)
		p.wakeWorkersLocked()
		close(p.space)
		p.space = make(chan struct{})
		p.mu.Unlock()
		// Started only now: until closed is set, a worker may add the CPU
		// fallback's workers, and a WaitGroup must not be waited on while
		// its count can rise from zero.
		go func() {
			p.wg.Wait()
			p.closeErr = p.closeEngines()
			close(p.workersDone)
		}()
	})
	select {
	case <-p.workersDone:
		return p.closeErr
	case <-ctx.Done():
	}
	p.abort()
	p.mu.Lock()
	p.abandonQueueLocked()
	p.mu.Unlock()
	// Cancelled runs normally return within moments. Wait for them, within
	// bounds, so the caller learns whether anything still runs.
	grace := time.NewTimer(p.closeGrace)
	defer grace.Stop()
	select {
	case <-p.workersDone:
		err := fmt.Errorf("gpupool: close: %w", ctx.Err())
		if p.closeErr != nil {
			err = errors.Join(err, p.closeErr)
		}
		return err
	case <-grace.C:
		return fmt.Errorf("%w (waited %v after cancelling the runs): %w", ErrCloseIncomplete, p.closeGrace, ctx.Err())
	}
}

// abandonQueueLocked empties the queue once Close has given up: calls still
// live fail with ErrPoolClosed, and batches of calls that already ended are
// dropped. Every removed batch's capacity is released.
func (p *Pool) abandonQueueLocked() {
	for _, b := range p.queue.snapshot() {
		p.failLocked(b.req, ErrPoolClosed) // removes the call's batches; no-op once ended
	}
	p.dropFinishedLocked() // what is left belongs to calls that had ended
}

// dropFinishedLocked removes the queued batches whose call already ended,
// returning their capacity.
func (p *Pool) dropFinishedLocked() {
	for _, b := range p.queue.dropFinished() {
		p.releaseLocked(len(b.idx))
		p.stats.Dropped++
	}
}
