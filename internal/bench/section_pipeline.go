package bench

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/scorer/scorer/gpupool"
	"github.com/scorer/scorer/internal/config"
	"github.com/scorer/scorer/internal/measure"
	"github.com/scorer/scorer/model"
	"github.com/scorer/scorer/schema"
)

// benchPipeline is the pipeline section: a throughput run at saturation,
// its recorded batches replayed on raw ORT, padding and tokenizer share
// from the same run, and latency at saturation.
func benchPipeline(ctx context.Context, b *benchRun, f *folder) error {
	e, cfg, m, mr, labels, sample := b.e, f.cfg, f.m, f.mr, f.labels, f.sample
	recs, keys, evs := splitLines(sample)
	progress(e, "%s: pipeline, %d transcripts (%d pairs), as fast as possible", m.Name, len(sample), pairsOf(sample, labels))
	// A failed section fails the whole run, so only a finished span counts.
	endPipeline := b.mt.begin("pipeline")
	run, err := runPipeline(ctx, b.rt, cfg, m, b.log, pipelineOpts{records: recs, keys: keys, keep: true, timeout: b.bf.pipelineDeadline, profile: f.prof})
	if err != nil {
		return fmt.Errorf("pipeline: %w", err)
	}
	progress(e, "%s: raw ORT replay of %d batches", m.Name, len(run.rec.batches))
	// The raw replay's sessions are the pipeline's: the one factory with the
	// settings the stack gave its pool.
	rawPairs, rawDur, rawCPU, err := replayRaw(ctx, gpupool.SessionFactory(m, cfg.SessionConfig(config.DetectHost())), run.device, run.workers, run.rec.batches)
	if err != nil {
		return fmt.Errorf("raw replay: %w", err)
	}
	tp := throughputResult{Transcripts: len(sample), Pairs: run.pairs, Batches: len(run.rec.batches), Device: run.device.Label(),
		PipelineSeconds: run.wall.Seconds(), RawSeconds: rawDur.Seconds(), Target: pipelineRatioTarget.bound}
	tp.PipelinePairsPerSec = float64(run.pairs) / run.wall.Seconds()
	// The service's score cache answers repeated pairs without the engine
	// (an earlier call's, and each distinct pair of a call once): what the
	// pipeline served, against what it inferred.
	tp.SamplePairs, tp.CacheHits = pairsOf(sample, labels), run.cache.Hits
	tp.ServedPairsPerSec = float64(tp.SamplePairs) / run.wall.Seconds()
	tp.RawPairsPerSec = float64(rawPairs) / rawDur.Seconds()
	var engine time.Duration
	for _, rb := range run.rec.batches {
		engine += rb.dur
	}
	tp.EngineBusyShare = engine.Seconds() / run.wall.Seconds()
	if r, ok := gpupool.MeanBusy(run.stats.GPUBusy); ok {
		tp.GPUBusy = &r
	}
	tp.Split = splitTime(run)
	tp.PipelineCPUSeconds, tp.RawCPUSeconds = run.cpu.Seconds(), rawCPU.Seconds()
	tp.CPURatio = (float64(run.pairs) / run.cpu.Seconds()) / (float64(rawPairs) / rawCPU.Seconds())
	tp.Ratio = tp.PipelinePairsPerSec / tp.RawPairsPerSec
	tp.OK = pipelineRatioTarget.ok(tp.Ratio)
	mr.Throughput = tp

	arrReal, arrPadded := arrivalPadding(run.rec.arrivals, run.shapeTokens, run.shapeRows)
	mr.Padding = paddingResult{Ours: run.stats.PaddingEfficiency(), ArrivalOrder: float64(arrReal) / float64(arrPadded),
		RealTokens: run.stats.RealTokens, PaddedTokens: run.stats.PaddedTokens, ArrivalPaddedTokens: arrPadded, Target: paddingTarget.bound}
	mr.Padding.OK = paddingTarget.ok(mr.Padding.Ours)

	tok, err := timeTokenizer(m, evs)
	if err != nil {
		return err
	}
	mr.Tokenizer = tokenizerShare{tokenizerResult: tok, PipelineCPUSeconds: run.cpu.Seconds(), Target: tokenizerShareTarget.bound}
	mr.Tokenizer.Share = tok.Seconds / run.cpu.Seconds()
	mr.Tokenizer.OK = tokenizerShareTarget.ok(mr.Tokenizer.Share)
	mr.LatencySaturation = latencyOf(run.latencies)
	mr.LatencySaturation.Transcripts = len(sample)
	endPipeline()
	return nil
}

// tokenizerResult is the tokenizer's speed over a set of sentences.
type tokenizerResult struct {
	Sentences    int     `json:"sentences"`
	Tokens       int     `json:"tokens"`
	Seconds      float64 `json:"seconds"`
	TokensPerSec float64 `json:"tokens_per_sec"`
}

// timeTokenizer encodes every sentence of the events once, single-threaded,
// as TranscriptScorer.Score does (hypotheses are encoded once at start and
// not counted).
func timeTokenizer(m *model.Model, evs []schema.TranscriptEvent) (tokenizerResult, error) {
	var r tokenizerResult
	t0 := time.Now()
	for i := range evs {
		for _, sents := range evs[i].Sections {
			for _, s := range sents {
				ids, err := m.Tokenizer.Encode(s)
				if err != nil {
					return r, err
				}
				r.Tokens += len(ids)
				r.Sentences++
			}
		}
	}
	r.Seconds = time.Since(t0).Seconds()
	if r.Seconds > 0 {
		r.TokensPerSec = float64(r.Tokens) / r.Seconds
	}
	return r, nil
}

// replayRaw scores the recorded batches, in the recorded order and shapes,
// with a fresh engine from the same factory on the same device, in one
// goroutine: the ORT limit the pipeline is compared with. The first batch
// runs once untimed so both sides are measured warm.
// It also returns the process CPU time the loop used: CPU time is far less
// disturbed than wall time by other tenants of a shared machine.
func replayRaw(ctx context.Context, f gpupool.EngineFactory, dev gpupool.Device, workers int, batches []recordedBatch) (pairs int, wall, cpu time.Duration, err error) {
	eng, err := f(dev)
	if err != nil {
		return 0, 0, 0, err
	}
	defer eng.Close()
	if len(batches) == 0 {
		return 0, 0, 0, nil
	}
	if _, err := eng.ScorePairs(ctx, batches[0].pairs); err != nil {
		return 0, 0, 0, err
	}
	// As many plain loops as the pool ran workers on this device, sharing one
	// session as the pool's workers do: the raw limit of the same hardware.
	var next atomic.Int64
	errs := make(chan error, max(workers, 1))
	t0, c0 := time.Now(), measure.CPUTime()
	var wg sync.WaitGroup
	for range max(workers, 1) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= len(batches) {
					return
				}
				if _, err := eng.ScorePairs(ctx, batches[i].pairs); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	wall, cpu = time.Since(t0), measure.CPUTime()-c0
	close(errs)
	if err := <-errs; err != nil {
		return 0, 0, 0, err
	}
	for _, b := range batches {
		pairs += len(b.pairs)
	}
	return pairs, wall, cpu, nil
}

// arrivalPadding is the padding a batcher without sorting would get: each
// ScorePairs call's pairs in arrival order, cut greedily under the same
// token budget and row limit as the pool.
func arrivalPadding(calls [][]model.Pair, maxTokens, maxRows int) (real, padded uint64) {
	for _, pairs := range calls {
		rows, longest := 0, 0
		flush := func() {
			padded += uint64(rows * longest)
			rows, longest = 0, 0
		}
		for _, p := range pairs {
			l := p.Len()
			if rows > 0 && (rows+1 > maxRows || (rows+1)*max(longest, l) > maxTokens) {
				flush()
			}
			rows++
			longest = max(longest, l)
			real += uint64(l)
		}
		flush()
	}
	return real, padded
}

func splitTime(r *pipelineRun) timeSplit {
	bs := r.rec.batches
	if len(bs) == 0 {
		return timeSplit{}
	}
	starts := slices.Clone(bs)
	slices.SortFunc(starts, func(a, b recordedBatch) int { return a.start.Compare(b.start) })
	var ts timeSplit
	ts.LeadInMs = ms(starts[0].start.Sub(r.first))
	// Merge busy intervals (several workers may overlap).
	var busy time.Duration
	curS, curE := starts[0].start, starts[0].start.Add(starts[0].dur)
	for _, b := range starts[1:] {
		e := b.start.Add(b.dur)
		if b.start.After(curE) {
			busy += curE.Sub(curS)
			curS, curE = b.start, e
		} else if e.After(curE) {
			curE = e
		}
	}
	busy += curE.Sub(curS)
	ts.TailMs = ms(r.last.Sub(curE))
	ts.EngineMs = ms(busy)
	ts.IdleGapsMs = ms(curE.Sub(starts[0].start) - busy)
	return ts
}
