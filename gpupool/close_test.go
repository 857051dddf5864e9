package gpupool

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/scorer/scorer/model"
)

// Tests for shutdown races, stuck admission, input errors and heat, from a
// review that reproduced each against the pool.

// newRefusingPool is one fake GPU whose used memory is over MemFraction, so
// every batch is refused (reason mem_fraction) until the test changes it.
// It registers no cleanup: each test closes the pool itself, because a
// broken Close is what some of them look for.
func newRefusingPool(t *testing.T, probe Probe, backoff time.Duration, extra ...Option) *Pool {
	t.Helper()
	opts := append([]Option{Mode(ModeCUDA), WithProbe(probe), WorkersPerDevice(1),
		Calibrate(Calibration{Disabled: true, FallbackBase: 1, FallbackPerToken: 1}),
		withHeadroom(1), withAdmissionBackoff(backoff), CPUFallback(false)}, extra...)
	p, err := New(testCtx(t), newFakeFactory(nil).factory, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func overFraction() *fakeGPU { return &fakeGPU{total: 1 << 30, used: 950 << 20} }

func waitEntered(t *testing.T, probe *gateProbe) {
	t.Helper()
	select {
	case <-probe.entered:
	case <-time.After(5 * time.Second):
		t.Fatal("no worker reached admission control")
	}
}

// closeWithin calls Close with a ctx of timeout and fails the test if Close
// itself does not return within 10 s (it once spun forever holding the
// pool's lock).
func closeWithin(t *testing.T, p *Pool, timeout time.Duration) error {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		done <- p.Close(ctx)
	}()
	select {
	case err := <-done:
		return err
	case <-time.After(10 * time.Second):
		t.Fatal("Close never returned")
		return nil
	}
}

// A call cancelled while its batch was inside admission must not leave that
// batch queued: Close with an expired ctx used to loop forever on it under
// the pool's lock.
func TestCloseAfterCancelDuringAdmissionReturns(t *testing.T) {
	probe := newGateProbe(overFraction())
	p := newRefusingPool(t, probe, time.Minute) // a refused worker sleeps until abort
	release := probe.arm()
	defer release()

	rctx, rcancel := context.WithCancel(t.Context())
	res := make(chan error, 1)
	go func() {
		_, err := p.ScorePairs(rctx, makePairs([]int{8}))
		res <- err
	}()
	waitEntered(t, probe)
	rcancel()
	select {
	case err := <-res:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("cancelled call err = %v, want Canceled", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("cancelled call never returned")
	}
	release() // the admission check now refuses the finished call's batch
	waitFor(t, func() bool { return p.Stats().InFlightBatches == 0 })

	if err := closeWithin(t, p, 10*time.Millisecond); err != nil &&
		(!errors.Is(err, context.DeadlineExceeded) || errors.Is(err, ErrCloseIncomplete)) {
		t.Fatalf("Close = %v, want nil or a complete DeadlineExceeded", err)
	}
	p.mu.Lock()
	admitted, queued := p.admitted, p.queue.len()
	p.mu.Unlock()
	if admitted != 0 || queued != 0 {
		t.Errorf("after Close: %d pairs admitted, %d batches queued; want the abandoned batch released", admitted, queued)
	}
}

// A batch refused while Close aborts must fail its call: a caller without a
// deadline used to block forever once every worker had exited.
func TestRefusalDuringAbortFailsTheCall(t *testing.T) {
	probe := newGateProbe(overFraction())
	p := newRefusingPool(t, probe, time.Millisecond)
	release := probe.arm()
	defer release()

	res := make(chan error, 1)
	go func() {
		_, err := p.ScorePairs(context.Background(), makePairs([]int{8})) // no deadline
		res <- err
	}()
	waitEntered(t, probe)
	closed := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
		defer cancel()
		closed <- p.Close(ctx)
	}()
	waitFor(t, func() bool { return p.abortCtx.Err() != nil })
	release() // the worker leaves admission only after the abort

	select {
	case err := <-res:
		if !errors.Is(err, ErrPoolClosed) {
			t.Fatalf("call err = %v, want ErrPoolClosed", err)
		}
	case <-time.After(5 * time.Second):
		p.mu.Lock()
		queued, inflight := p.queue.len(), p.inflight
		p.mu.Unlock()
		t.Fatalf("call still blocked 5s after Close aborted (queue %d, in flight %d)", queued, inflight)
	}
	select {
	case err := <-closed:
		if !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, ErrCloseIncomplete) {
			t.Fatalf("Close = %v, want a complete DeadlineExceeded", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Close never returned")
	}
}

// A timed-out Close waits a bounded grace for cancelled runs: when they stop
// in time the engines are closed before Close returns, so the caller may
// unload ONNX Runtime and NVML.
func TestCloseTimeoutWaitsForCancelledRuns(t *testing.T) {
	f := newFakeFactory(map[string]*fakeEngine{"cpu": {gate: make(chan struct{})}}) // ends only by ctx
	p, err := New(testCtx(t), f.factory, Mode(ModeCPU))
	if err != nil {
		t.Fatal(err)
	}
	go func() { _, _ = p.ScorePairs(testCtx(t), makePairs([]int{1, 2})) }()
	waitFor(t, func() bool { return p.Stats().InFlightBatches == 1 })
	err = closeWithin(t, p, 50*time.Millisecond)
	if !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, ErrCloseIncomplete) {
		t.Fatalf("Close = %v, want a complete DeadlineExceeded", err)
	}
	if _, _, _, closed := f.engine("cpu").snapshot(); !closed {
		t.Error("Close returned before the engine was closed")
	}
}

// A run that ignores cancellation keeps Close from completing: Close says so
// with ErrCloseIncomplete (the caller must not unload the libraries), and a
// later Close finishes the job once the run returns.
func TestCloseReportsRunsStillGoing(t *testing.T) {
	hang := make(chan struct{})
	f := newFakeFactory(map[string]*fakeEngine{"cpu": {hang: hang}})
	p, err := New(testCtx(t), f.factory, Mode(ModeCPU), MaxBatchRows(2))
	if err != nil {
		t.Fatal(err)
	}
	p.closeGrace = 100 * time.Millisecond
	res := make(chan error, 1)
	go func() {
		_, err := p.ScorePairs(testCtx(t), makePairs([]int{1, 2, 3, 4, 5}))
		res <- err
	}()
	waitFor(t, func() bool { return p.Stats().InFlightBatches == 1 })
	err = closeWithin(t, p, 50*time.Millisecond)
	if !errors.Is(err, ErrCloseIncomplete) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Close = %v, want ErrCloseIncomplete wrapping DeadlineExceeded", err)
	}
	if _, _, _, closed := f.engine("cpu").snapshot(); closed {
		t.Fatal("engine closed while a run was still going")
	}
	select {
	case err := <-res:
		if !errors.Is(err, ErrPoolClosed) {
			t.Fatalf("abandoned call err = %v, want ErrPoolClosed", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("abandoned call never returned")
	}
	close(hang)
	if err := closeWithin(t, p, 5*time.Second); err != nil {
		t.Fatalf("second Close = %v, want nil", err)
	}
	if _, _, _, closed := f.engine("cpu").snapshot(); !closed {
		t.Error("engine not closed after the second Close")
	}
}

// A one-pair batch a GPU keeps refusing (memory held for good) moves off
// that GPU after stuckRefusals refusals over stuckAfter: to the CPU
// fallback, or to a loud failure without one. It must never wait forever.
func TestStuckOnePairBatchMovesOffDevice(t *testing.T) {
	t.Run("cpu fallback", func(t *testing.T) {
		probe := newFakeProbe(overFraction())
		f := newFakeFactory(nil)
		p := newPool(t, f, gpuOpts(probe, Mode(ModeAuto), Registerer(prometheus.NewRegistry()), WorkersPerDevice(1))...) // cuda never falls back
		p.mu.Lock()
		p.stuckAfter = 20 * time.Millisecond
		p.mu.Unlock()
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		pairs := makePairs([]int{8, 9, 10}) // refused, split, then stuck as single pairs
		scores, err := p.ScorePairs(ctx, pairs)
		if err != nil {
			t.Fatal(err)
		}
		if err := checkScores(pairs, scores); err != nil {
			t.Fatal(err)
		}
		st := p.Stats()
		if st.Fallbacks != 1 || len(st.Devices) != 2 || st.Devices[0].Pairs != 0 || st.Devices[1].Pairs != 3 {
			t.Errorf("stats %+v: want all three pairs scored by the CPU fallback", st)
		}
		if st.Refusals < stuckRefusals {
			t.Errorf("%d refusals, want at least %d before giving up on the GPU", st.Refusals, stuckRefusals)
		}
		if n := metricValue(t, p.m.admission.WithLabelValues("cuda:0", "refuse", "stuck")); n < 1 {
			t.Error("no scorer_admission_total{decision=refuse,reason=stuck} counted")
		}
	})
	t.Run("no fallback", func(t *testing.T) {
		p := newRefusingPool(t, newFakeProbe(overFraction()), time.Millisecond)
		t.Cleanup(func() { _ = closeWithin(t, p, 5*time.Second) })
		p.mu.Lock()
		p.stuckAfter = 20 * time.Millisecond
		p.mu.Unlock()
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		_, err := p.ScorePairs(ctx, makePairs([]int{8}))
		if err == nil || errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "cuda:0") {
			t.Fatalf("err = %v, want a no-device error naming cuda:0 well before the deadline", err)
		}
	})
	t.Run("transient pressure still waits", func(t *testing.T) {
		// With the default stuckAfter, memory freed after 100 ms is waited
		// for on the GPU, as before.
		probe := newFakeProbe(overFraction())
		f := newFakeFactory(nil)
		p := newPool(t, f, gpuOpts(probe, WorkersPerDevice(1))...)
		time.AfterFunc(100*time.Millisecond, func() { probe.set(0, func(g *fakeGPU) { g.used = 100 << 20 }) })
		mustScore(t, p, makePairs([]int{8}))
		if st := p.Stats(); st.Fallbacks != 0 || st.Devices[0].Pairs != 1 {
			t.Errorf("stats %+v: want the pair scored on cuda:0", st)
		}
	})
}

// Input no engine can run fails the call at once with ErrInvalidInput and
// never counts against a device.
func TestInvalidInputFailsAtOnceWithoutDeviceBlame(t *testing.T) {
	good := makePairs([]int{4})[0]
	for name, bad := range map[string]model.Pair{
		"empty":             {},
		"type ids mismatch": {IDs: []int32{1, 2, 3}, TypeIDs: []int32{0}},
		"too long":          makePairs([]int{17})[0],
	} {
		t.Run(name, func(t *testing.T) {
			probe := newFakeProbe(&fakeGPU{total: 80 << 30})
			f := newFakeFactory(map[string]*fakeEngine{"cuda:0": {maxLength: 16}})
			p := newPool(t, f, gpuOpts(probe, withMaxDeviceFailures(1))...)
			_, err := p.ScorePairs(testCtx(t), []model.Pair{good, bad, good})
			if !errors.Is(err, ErrInvalidInput) || !strings.Contains(err.Error(), "pair 1") {
				t.Fatalf("err = %v, want ErrInvalidInput naming pair 1", err)
			}
			if calls, _, _, _ := f.engine("cuda:0").snapshot(); calls != 0 {
				t.Errorf("engine ran %d times for a call rejected up front", calls)
			}
			// Still healthy: a valid call (nil type IDs are fine) runs on the GPU.
			ok := []model.Pair{good, {IDs: []int32{7, 8}}}
			if scores, err := p.ScorePairs(testCtx(t), ok); err != nil || len(scores) != 2 {
				t.Fatalf("valid call after: %v, %v", scores, err)
			}
			if st := p.Stats(); st.Devices[0].Degraded || st.Fallbacks != 0 || st.Devices[0].Pairs != 2 {
				t.Errorf("stats %+v: want the GPU healthy and used", st)
			}
		})
	}
	for name, rejected := range map[string]error{
		"engine rejects": fmt.Errorf("fake: pair 0 too long: %w", ErrInvalidInput),
		"model rejects":  fmt.Errorf("model: scoring 4 pairs: %w", model.ErrInvalidInput),
	} {
		t.Run(name, func(t *testing.T) {
			probe := newFakeProbe(&fakeGPU{total: 80 << 30}, &fakeGPU{total: 80 << 30})
			f := newFakeFactory(map[string]*fakeEngine{"cuda:0": {err: rejected}, "cuda:1": {err: rejected}})
			p := newPool(t, f, gpuOpts(probe, withMaxDeviceFailures(1))...)
			_, err := p.ScorePairs(testCtx(t), makePairs([]int{4, 5, 6, 7}))
			if !errors.Is(err, ErrInvalidInput) {
				t.Fatalf("err = %v, want ErrInvalidInput", err)
			}
			var perm interface{ Permanent() bool }
			if !errors.As(err, &perm) || !perm.Permanent() {
				t.Errorf("err = %v: want it to report Permanent() (the consumer's test for bad input)", err)
			}
			c0, _, _, _ := f.engine("cuda:0").snapshot()
			c1, _, _, _ := f.engine("cuda:1").snapshot()
			if c0+c1 != 1 {
				t.Errorf("engines ran %d times, want one run and no retries", c0+c1)
			}
			st := p.Stats()
			if st.Devices[0].Degraded || st.Devices[1].Degraded || st.Fallbacks != 0 || st.RunErrors != 0 || st.Splits != 0 {
				t.Errorf("stats %+v: want no device blamed, no split, no fallback", st)
			}
		})
	}
}

// A GPU hot from our own load yields only to a cooler GPU: alone (or with
// every GPU hot) it must not sleep before each pull.
func TestHotGPUWithoutCoolerPeerDoesNotThrottle(t *testing.T) {
	for name, gpus := range map[string][]*fakeGPU{
		"only gpu":      {{total: 80 << 30, util: 99}},
		"every gpu hot": {{total: 80 << 30, util: 99}, {total: 80 << 30, throttle: 0x4}}, // SwPowerCap
	} {
		t.Run(name, func(t *testing.T) {
			probe := newFakeProbe(gpus...)
			f := newFakeFactory(nil)
			p := newPool(t, f, gpuOpts(probe, MaxBatchRows(1), WorkersPerDevice(1), withAdmissionBackoff(300*time.Millisecond))...)
			start := time.Now()
			mustScore(t, p, makePairs(make40(4)[:20]))
			// At most the first pull waits, while the other GPU is not yet
			// known to be hot; a backoff per pull would take 3 s or more.
			if d := time.Since(start); d > 1500*time.Millisecond {
				t.Errorf("20 one-pair batches took %v: hot devices backed off with no cooler device to yield to", d)
			}
			for _, d := range p.Stats().Devices {
				if d.Pairs > 0 && !d.Hot {
					t.Errorf("%s not marked hot", d.Device.Label())
				}
			}
		})
	}
}

func TestCloseDrainsThenRejects(t *testing.T) {
	f := newFakeFactory(map[string]*fakeEngine{"cpu": {delay: 5 * time.Millisecond}})
	p, err := New(testCtx(t), f.factory, Mode(ModeCPU), MaxBatchRows(4))
	if err != nil {
		t.Fatal(err)
	}
	results := make(chan error, 4)
	for c := 0; c < 4; c++ {
		go func() {
			pairs := makePairs(realisticLengths(40, uint64(c)))
			scores, err := p.ScorePairs(testCtx(t), pairs)
			if err == nil {
				err = checkScores(pairs, scores)
			}
			results <- err
		}()
	}
	waitFor(t, func() bool { return p.Stats().InFlightBatches > 0 })
	ctx, cancel := context.WithTimeout(testCtx(t), 10*time.Second)
	defer cancel()
	if err := p.Close(ctx); err != nil {
		t.Fatalf("Close: %v", err)
	}
	for c := 0; c < 4; c++ {
		select {
		case err := <-results:
			// A call that had not enqueued before Close may be refused;
			// one that was queued must complete.
			if err != nil && !errors.Is(err, ErrPoolClosed) {
				t.Errorf("call during Close: %v", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("a call never returned")
		}
	}
	if _, _, _, closed := f.engine("cpu").snapshot(); !closed {
		t.Error("engine not closed after Close")
	}
	if _, err := p.ScorePairs(testCtx(t), makePairs([]int{1})); !errors.Is(err, ErrPoolClosed) {
		t.Errorf("after Close: err = %v, want ErrPoolClosed", err)
	}
	if err := p.Close(ctx); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

func TestCloseTimeoutCancelsHungRuns(t *testing.T) {
	f := newFakeFactory(map[string]*fakeEngine{"cpu": {gate: make(chan struct{})}}) // never opens
	p, err := New(testCtx(t), f.factory, Mode(ModeCPU), MaxBatchRows(2))
	if err != nil {
		t.Fatal(err)
	}
	res := make(chan error, 1)
	go func() {
		_, err := p.ScorePairs(testCtx(t), makePairs([]int{1, 2, 3, 4, 5}))
		res <- err
	}()
	waitFor(t, func() bool { return p.Stats().InFlightBatches == 1 })
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	if err := p.Close(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Close = %v, want DeadlineExceeded", err)
	}
	select {
	case err := <-res:
		if !errors.Is(err, ErrPoolClosed) {
			t.Fatalf("abandoned call err = %v, want ErrPoolClosed", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("abandoned call never returned")
	}
	waitFor(t, func() bool { _, _, _, closed := f.engine("cpu").snapshot(); return closed })
}
