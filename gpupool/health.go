package gpupool

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// deviceHealth is a device's health, guarded by Pool.mu: degraded devices
// take no work until a re-probe passes (probation); a hot one yields to a
// cooler GPU.
type deviceHealth struct {
	degraded bool
	failures int // consecutive failed runs
	hot      bool
}

// degradeLocked takes d out of service (its workers exit) and, for a GPU,
// starts its probation: after Probation the device is re-probed with a
// one-pair batch and rejoins on success. A GPU that failed a few runs (a
// transient Xid, a neighbour's burst that caused one-row OOMs) is not lost
// until restart that way.
func (p *Pool) degradeLocked(d *device) {
	d.degraded = true
	p.m.gpuDegraded.WithLabelValues(d.dev.Label()).Set(1)
	if d.dev.Kind != CUDA || p.closed {
		return
	}
	p.wg.Add(1) // a worker holds the count up, so Close's Wait cannot have begun at zero
	go p.probation(d)
}

// probation waits out Probation, then re-probes d until it passes, the
// pool closes or aborts. A pass puts d back in service with new workers.
func (p *Pool) probation(d *device) {
	defer p.wg.Done()
	label := d.dev.Label()
	for {
		t := time.NewTimer(p.cfg.probation)
		select {
		case <-t.C:
		case <-p.closing:
			t.Stop()
			return
		case <-p.abortCtx.Done():
			t.Stop()
			return
		}
		err := p.reprobe(d)
		p.mu.Lock()
		if p.closed || p.abortCtx.Err() != nil {
			p.mu.Unlock()
			return
		}
		if err == nil {
			d.degraded, d.failures = false, 0
			p.m.gpuDegraded.WithLabelValues(label).Set(0)
			p.log.Info().Str("device", label).Msg("gpupool: degraded device passed its re-probe; it takes work again")
			p.startWorkersLocked(d)
			p.wakeWorkersLocked()
			p.mu.Unlock()
			return
		}
		p.mu.Unlock()
		p.log.Warn().Err(err).Str("device", label).Dur("next_try_in", p.cfg.probation).Msg("gpupool: degraded device failed its re-probe")
	}
}

// reprobeTimeout bounds one re-probe batch: a healthy GPU runs it in
// milliseconds, a hung one must not hold the probation goroutine forever.
const reprobeTimeout = 30 * time.Second

// reprobe checks that d's GPU is present (NVML) and runs one small batch
// on its engine.
func (p *Pool) reprobe(d *device) error {
	if p.probe != nil {
		if _, _, _, err := p.probe.MemoryInfo(d.dev.Index); errors.Is(err, ErrGPULost) {
			return err
		}
	}
	ctx, cancel := context.WithTimeout(p.abortCtx, reprobeTimeout)
	defer cancel()
	shape := Shape{Rows: 1, Len: 8}
	if n := engineMaxLength(d.engine); n > 0 {
		shape.Len = min(shape.Len, n)
	}
	scores, err := d.engine.ScorePairs(ctx, syntheticPairs(shape, p.cfg.calibration.TokenID))
	if err == nil && len(scores) != 1 {
		err = fmt.Errorf("gpupool: %s re-probe returned %d scores for 1 pair", d.dev.Label(), len(scores))
	}
	return err
}

// updateHeat reads utilization and throttle reasons and moves d between
// cool and hot with hysteresis: hot at HotUtilization or any power/thermal
// throttle, cool again only under CoolUtilization with no throttling, so a
// device near the threshold does not flap. Unsupported readings count as
// cool.
func (p *Pool) updateHeat(d *device) {
	util, uerr := p.probe.Utilization(d.dev.Index)
	reasons, terr := p.probe.Throttled(d.dev.Index)
	throttled := terr == nil && reasons&throttleHotMask != 0
	p.mu.Lock()
	defer p.mu.Unlock()
	was := d.hot
	switch {
	case throttled || (uerr == nil && util >= p.cfg.hotUtilization):
		d.hot = true
	case !throttled && (uerr != nil || util < p.cfg.coolUtilization):
		d.hot = false
	}
	if d.hot != was {
		p.log.Info().Str("device", d.dev.Label()).Bool("hot", d.hot).Uint32("utilization", util).
			Uint64("throttle_reasons", reasons).Msg("gpupool: device heat changed")
	}
}
