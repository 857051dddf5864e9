package gpupool

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/scorer/scorer/model"
)

// maxRefusals is how many admission refusals a batch takes before it is
// split (or, at one row, moved off the refusing device): waiting helps when
// memory is briefly taken, splitting when the batch is simply too big now.
const maxRefusals = 3

// stuckRefusals is the least number of refusals, over at least the pool's
// stuckAfter (default 30 s), after which a one-pair batch moves off the
// refusing device. A single pair cannot be split; it waits for memory in use
// right now to come back, but memory another tenant (or our own arena) holds
// for good never does, and the batch would wait forever without a word.
const stuckRefusals = 20

// worker pulls batches for d until the pool is drained or aborted, or d is
// degraded. It is the only thing that calls d's engine on its goroutine.
func (p *Pool) worker(d *device) {
	defer p.wg.Done()
	for {
		p.mu.Lock()
		yield := d.hot && p.coolerGPULocked(d)
		p.mu.Unlock()
		if yield {
			// A hot device lets cooler ones pull first: a smaller share.
			if !p.sleep(p.cfg.admissionBackoff) {
				return
			}
		}
		b, ok := p.next(d)
		if !ok {
			return
		}
		p.process(d, b)
	}
}

// coolerGPULocked reports whether another GPU that is neither hot nor
// degraded could take work instead of d. Only then is backing off worth it:
// our own kernels push a busy GPU to full utilisation (and, under sustained
// load, to its power cap), and a GPU with no cooler peer that yields just
// idles. The CPU is no peer: a GPU, hot or not, beats it.
func (p *Pool) coolerGPULocked(d *device) bool {
	return slices.ContainsFunc(p.devices, func(o *device) bool {
		return o != d && o.dev.Kind == CUDA && o.live() && !o.hot
	})
}

// gpuMayTakeLocked reports whether a live GPU may run b. The lazily
// created CPU fallback is the last resort: once a GPU is back from
// probation it leaves such batches to it, taking only those every GPU must
// avoid.
func (p *Pool) gpuMayTakeLocked(b *batch) bool {
	return slices.ContainsFunc(p.devices, func(o *device) bool {
		return o.dev.Kind == CUDA && o.live() && !slices.Contains(b.avoid, o.slot)
	})
}

// sleep waits d or until the pool aborts; false means aborted.
func (p *Pool) sleep(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-p.abortCtx.Done():
		return false
	}
}

// next takes the first queued batch d may run, dropping batches whose call
// already ended. It blocks while there is none and returns false when the
// worker should exit: the pool is closed and fully drained, aborted, or d is
// degraded.
func (p *Pool) next(d *device) (*batch, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for {
		if d.degraded || p.abortCtx.Err() != nil {
			return nil, false
		}
		p.dropFinishedLocked() // never spend device time on abandoned work
		if b, ok := p.queue.take(func(b *batch) bool { return p.mayRunLocked(d, b) }); ok {
			p.inflight++
			return b, true
		}
		// Running batches may still come back split, so a closing pool is
		// drained only when nothing is queued or running.
		if p.closed && p.queue.len() == 0 && p.inflight == 0 {
			return nil, false
		}
		work := p.work
		p.mu.Unlock()
		select {
		case <-work:
		case <-p.abortCtx.Done():
		}
		p.mu.Lock()
	}
}

// mayRunLocked reports whether a worker of d may take b: not a device b
// must avoid (it failed there), and not the CPU fallback while a live GPU
// may run b.
func (p *Pool) mayRunLocked(d *device, b *batch) bool {
	return !slices.Contains(b.avoid, d.slot) && !(d.fallback && p.gpuMayTakeLocked(b))
}

// process admits, runs and settles one batch taken by a worker of d.
func (p *Pool) process(d *device, b *batch) {
	pairs := make([]model.Pair, len(b.idx))
	for i, j := range b.idx {
		pairs[i] = b.req.pairs[j]
	}
	rows, maxLen, real := shape(b.req.pairs, b.idx)
	// Admission reserves for the length the engine runs the batch at.
	maxLen = padLen(d.engine, maxLen)

	var reserved float64 // admitted memory estimate, returned after the run
	if d.dev.Kind == CUDA {
		dec := p.admit(d, rows, max(maxLen, 1))
		if !dec.ok {
			p.refused(d, b, dec) // counts the refusal with its final reason
			return
		}
		reserved = dec.est
		p.m.admission.WithLabelValues(d.dev.Label(), dec.decision(), dec.reason).Inc()
	}

	ctx, cancel := context.WithCancel(b.req.ctx)
	stop := context.AfterFunc(p.abortCtx, cancel) // Close timed out: stop runs
	start := time.Now()
	p.mu.Lock()
	p.running[b] = start
	p.mu.Unlock()
	scores, err := d.engine.ScorePairs(ctx, pairs)
	elapsed := time.Since(start).Seconds()
	stop()
	cancel()
	if d.dev.Kind == CUDA && p.sigGuard != nil {
		// CUDA can replace Go's SIGINT/SIGTERM handlers on any run
		// (onnxruntime_go #140); put them back before a signal can arrive.
		if n, rerr := p.sigGuard.RestoreChanged(); rerr != nil {
			p.log.Warn().Err(rerr).Msg("gpupool: cannot check signal handlers after a GPU run")
		} else if n > 0 {
			p.log.Warn().Str("device", d.dev.Label()).Int("handlers", n).Msg("gpupool: a GPU run replaced shutdown signal handlers; restored them")
		}
	}
	p.m.inference.WithLabelValues(d.dev.Label()).Observe(elapsed)
	if err == nil && len(scores) != len(pairs) {
		err = fmt.Errorf("gpupool: %s engine returned %d scores for %d pairs", d.dev.Label(), len(scores), len(pairs))
	}
	if err == nil {
		for i, j := range b.idx {
			b.req.out[j] = scores[i]
		}
	}

	p.mu.Lock()
	defer p.mu.Unlock()
	defer p.settledLocked()
	delete(p.running, b)
	d.reserved -= reserved
	if b.req.finished {
		p.releaseLocked(rows) // the call ended while this ran; nobody wants it
		return
	}
	if err == nil {
		d.failures = 0
		d.batches++
		d.pairs += uint64(rows)
		padded := rows * maxLen
		p.stats.Batches++
		p.stats.Pairs += uint64(rows)
		p.stats.RealTokens += uint64(real)
		p.stats.PaddedTokens += uint64(padded)
		p.m.pairsScored.Add(float64(rows))
		p.m.batchRows.Observe(float64(rows))
		p.m.batchTokens.Observe(float64(padded))
		if padded > 0 {
			p.m.paddingRatio.Observe(float64(real) / float64(padded))
		}
		b.req.remaining -= rows
		p.releaseLocked(rows)
		if b.req.remaining == 0 {
			b.req.finished = true
			close(b.req.done)
		}
		return
	}
	if cerr := b.req.ctx.Err(); cerr != nil {
		p.failLocked(b.req, cerr) // the caller gave up; not the device's fault
		p.releaseLocked(rows)
		return
	}
	if p.abortCtx.Err() != nil {
		p.failLocked(b.req, fmt.Errorf("%w: batch cancelled on %s: %w", ErrPoolClosed, d.dev.Label(), err))
		p.releaseLocked(rows)
		return
	}
	if isInvalidInput(err) {
		// The pairs are bad, not the device: no retry, split or other
		// device can help, so the call fails now and the device is not
		// blamed.
		if !errors.Is(err, ErrInvalidInput) {
			// One sentinel for callers, whichever layer found the fault.
			err = fmt.Errorf("%w: %w", ErrInvalidInput, err)
		}
		p.failLocked(b.req, fmt.Errorf("gpupool: %s rejected a batch of %d pairs: %w", d.dev.Label(), rows, err))
		p.releaseLocked(rows)
		return
	}
	p.runFailedLocked(d, b, err)
}

// settledLocked marks a taken batch as no longer running and wakes workers:
// a closing pool may now be drained, or a split batch may be waiting.
func (p *Pool) settledLocked() {
	p.inflight--
	p.wakeWorkersLocked()
}

// runFailedLocked handles a failed run: the batch is split in halves and
// retried (a smaller batch needs less memory, and halves isolate a bad
// pair); a single pair moves off the device. The device's consecutive
// failures grow, and past MaxDeviceFailures it is degraded and its work goes
// to the other devices, the CPU last. Retries are bounded by MaxAttempts.
func (p *Pool) runFailedLocked(d *device, b *batch, err error) {
	oom := errors.Is(err, model.ErrOutOfMemory)
	label := d.dev.Label()
	if oom {
		p.stats.OOMRetries++
		p.m.oomRetries.WithLabelValues(label).Inc()
	} else {
		p.stats.RunErrors++
	}
	ev := p.log.Warn().Err(err).Str("device", label).Int("rows", len(b.idx)).Bool("oom", oom)
	// The CPU is the last resort: it is never degraded, or nothing could
	// run; a broken CPU engine surfaces through MaxAttempts instead. An OOM
	// on a multi-row batch says the batch was too big, not that the device
	// is broken, so only other errors (and a one-row OOM) count.
	if d.dev.Kind != CPU && (!oom || len(b.idx) == 1) {
		d.failures++
		if d.failures >= p.cfg.maxDeviceFailures && !d.degraded {
			p.degradeLocked(d)
			ev = p.log.Error().Err(err).Str("device", label).Int("consecutive_failures", d.failures).Dur("probation", p.cfg.probation)
			ev.Msg("gpupool: device degraded, routing its work elsewhere until it passes a re-probe")
			ev = nil
		}
	}
	if ev != nil {
		ev.Msg("gpupool: inference failed, retrying")
	}
	b.attempts++
	b.lastErr = err
	if b.attempts > p.cfg.maxAttempts {
		p.failLocked(b.req, fmt.Errorf("gpupool: batch of %d pairs failed %d times, last on %s: %w",
			len(b.idx), b.attempts, label, err))
		p.releaseLocked(len(b.idx))
		return
	}
	if len(b.idx) == 1 {
		b.avoid = append(b.avoid, d.slot)
		p.pushLocked(b, true)
	} else {
		p.splitLocked(b)
	}
	p.reconcileLocked()
}

// splitLocked requeues b's two halves at the front. The halves keep b's
// attempts and avoided devices, so retries stay bounded.
func (p *Pool) splitLocked(b *batch) {
	h := len(b.idx) / 2
	second := &batch{req: b.req, idx: b.idx[h:], attempts: b.attempts, avoid: slices.Clone(b.avoid), lastErr: b.lastErr}
	first := &batch{req: b.req, idx: b.idx[:h], attempts: b.attempts, avoid: slices.Clone(b.avoid), lastErr: b.lastErr}
	p.stats.Splits++
	p.pushLocked(second, true)
	p.pushLocked(first, true)
}

// refused handles a batch a GPU did not admit. It goes back to the front of
// the queue so another device can take it; after maxRefusals (or at once if
// it could never fit) it is split, and a single pair moves off the device
// if it could never fit there, or once the device has refused it
// stuckRefusals times over stuckAfter (counted as reason "stuck"). The
// worker then backs off so it does not spin on the same refusal. A batch
// whose call ended meanwhile is dropped, and one refused after Close gave
// up fails its call: the queue was already abandoned and the workers are
// leaving, so a re-queued batch would wait for nobody.
func (p *Pool) refused(d *device, b *batch, dec admission) {
	label := d.dev.Label()
	reason := dec.reason
	backoff := true
	p.mu.Lock()
	p.stats.Refusals++
	b.refusals++
	if b.refusedSince.IsZero() {
		b.refusedSince = time.Now()
	}
	switch {
	case b.req.finished:
		p.releaseLocked(len(b.idx))
		p.stats.Dropped++
		backoff = false
	case p.abortCtx.Err() != nil:
		p.failLocked(b.req, fmt.Errorf("%w: batch refused on %s while closing", ErrPoolClosed, label))
		p.releaseLocked(len(b.idx))
		backoff = false
	case dec.gpuLost:
		if !d.degraded {
			p.degradeLocked(d)
			p.log.Error().Str("device", d.dev.Label()).Str("reason", dec.reason).Dur("probation", p.cfg.probation).
				Msg("gpupool: device degraded, routing its work elsewhere until it passes a re-probe")
		}
		p.pushLocked(b, true)
	case len(b.idx) > 1 && (dec.neverFits || b.refusals >= maxRefusals):
		p.splitLocked(b)
	case dec.neverFits:
		// One pair this device can never hold: another device (or the CPU)
		// must take it. A one-pair batch refused only for memory in use
		// right now waits instead, since that memory comes back, unless it
		// is stuck (next case).
		b.avoid = append(b.avoid, d.slot)
		p.pushLocked(b, true)
	case len(b.idx) == 1 && b.refusals >= stuckRefusals && time.Since(b.refusedSince) >= p.stuckAfter:
		// Memory this device has not given back for this long is not
		// coming back soon: let another device, or the CPU, take the pair.
		waited := time.Since(b.refusedSince)
		reason = "stuck"
		p.log.Warn().Str("device", label).Str("reason", dec.reason).Int("refusals", b.refusals).
			Dur("waited", waited).Msg("gpupool: device keeps refusing a one-pair batch, moving it elsewhere")
		b.lastErr = fmt.Errorf("gpupool: %s refused a one-pair batch %d times over %v (%s)",
			label, b.refusals, waited.Round(time.Millisecond), dec.reason)
		b.avoid = append(b.avoid, d.slot)
		b.refusals, b.refusedSince = 0, time.Time{}
		p.pushLocked(b, true)
	default:
		p.pushLocked(b, true)
	}
	p.m.admission.WithLabelValues(label, dec.decision(), reason).Inc()
	if backoff {
		p.reconcileLocked()
	}
	p.settledLocked()
	p.mu.Unlock()
	if backoff {
		p.sleep(p.cfg.admissionBackoff)
	}
}
