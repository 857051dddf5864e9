package gpupool

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/scorer/scorer/model/ortenv"
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
	sigGuard *ortenv.SignalGuard

	// abortCtx ends when Close's ctx expires: running batches are cancelled
	// and workers stop without draining.
	abortCtx context.Context
	abort    context.CancelFunc

	wg          sync.WaitGroup // workers and probation timers
	closing     chan struct{}  // closed when Close begins: probations stop
	closeOnce   sync.Once      // starts the closer
	workersDone chan struct{}  // closed after workers exit and engines close
	closeErr    error          // engine/probe close errors, set before workersDone closes

	// mu guards what each job keeps, in the file of its job: the calls
	// and their queue (calls.go), the devices and the CPU fallback
	// (devices.go), the counters (stats.go), and closed. Per device,
	// health and admission's reservations (device).
	mu sync.Mutex
	callState
	deviceSet
	busyState
	stats  Stats
	closed bool

	// closeGrace bounds Close's wait for cancelled runs once its ctx ended;
	// set by New (tests shorten it before Close).
	closeGrace time.Duration
	// stuckAfter is how long a one-pair batch may be refused on a device
	// before it moves off it; guarded by mu (tests shorten it).
	stuckAfter time.Duration
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
	m, err := newMetrics(c.reg, c.mode)
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
		callState: callState{
			queue:   newQueue(m.queueDepth),
			running: map[*batch]time.Time{},
			work:    make(chan struct{}),
			space:   make(chan struct{}),
		},
		closeGrace: defaultCloseGrace,
		stuckAfter: defaultStuckAfter,
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
	p.startBusySamplerLocked()
	return p, nil
}

// BatchShape is the token and row caps the pool plans each call's batches
// under: MaxBatchTokens and MaxBatchRows, or the CPUBatchShape caps when
// the pool's own device is the CPU. Fixed once New returns.
func (p *Pool) BatchShape() (tokens, rows int) {
	return p.cfg.maxBatchTokens, p.cfg.maxBatchRows
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
