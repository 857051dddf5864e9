package bench

import (
	"context"
	"fmt"
)

// benchLatency is the latency section: the pipeline again, the shortest
// transcripts at a low steady rate (--latency-rate).
func benchLatency(ctx context.Context, b *benchRun, f *folder) error {
	short := shortest(b.corpus, b.bf.latencyN)
	recs, keys, _ := splitLines(short)
	progress(b.e, "%s: latency, %d short transcripts (%d pairs) at %g/s", f.m.Name, len(short), pairsOf(short, f.labels), b.bf.latencyRate)
	end := b.mt.begin("latency")
	lr, err := runPipeline(ctx, b.rt, f.cfg, f.m, b.log, pipelineOpts{records: recs, keys: keys, rate: b.bf.latencyRate, timeout: b.bf.pipelineDeadline})
	end()
	if err != nil {
		return fmt.Errorf("latency: %w", err)
	}
	l := latencyOf(lr.latencies)
	l.Transcripts, l.Rate = len(short), b.bf.latencyRate
	l.BatchMaxWaitMs = ms(f.cfg.BatchMaxWait)
	l.BatchScoreMs = ms(percentile(lr.scoreDurs, 0.5))
	l.BoundMs = l.BatchMaxWaitMs + 2*l.BatchScoreMs
	ok := l.P99Ms <= l.BoundMs
	l.BoundOK = &ok
	f.mr.LatencyLow = &l
	return nil
}
