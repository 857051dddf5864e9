package bench

import (
	"context"
	"fmt"

	"github.com/scorer/scorer/internal/config"
	"github.com/scorer/scorer/internal/measure"
	"github.com/scorer/scorer/internal/scoring"
	"github.com/scorer/scorer/model"
	"github.com/scorer/scorer/schema"
)

// benchScaling is the scaling section: CPU stacks at threads × workers
// (pool and tokenizer, no Kafka).
func benchScaling(ctx context.Context, b *benchRun, f *folder) error {
	sevs := scalingEvents(f.sample, b.bf.scalingPairs, f.labels)
	progress(b.e, "%s: CPU scaling, threads %v × workers %v", f.m.Name, b.threads, b.workers)
	end := b.mt.begin("scaling")
	pts, err := runScaling(ctx, b.rt, f.cfg, f.m, sevs, b.threads, b.workers, b.bf.scalingRounds)
	end()
	if err != nil {
		return err
	}
	f.mr.Scaling = pts
	return nil
}

// scalingPoint is scoring throughput at one thread/worker setting.
type scalingPoint struct {
	Threads     int     `json:"intra_op_threads"`
	Workers     int     `json:"workers"`
	Pairs       int     `json:"pairs"`
	PairsPerSec float64 `json:"pairs_per_sec"`
}

// runScaling scores the same events through a CPU pool (TranscriptScorer,
// tokenization included, no Kafka) at each threads × workers setting. Kafka
// is left out because it does not change with these settings and would only
// add noise and minutes.
func runScaling(ctx context.Context, rt *scoring.Runtime, cfg config.Config, m *model.Model, evs []schema.TranscriptEvent, threads, workers []int, rounds int) ([]scalingPoint, error) {
	var out []scalingPoint
	// Settings are measured in interleaved rounds and each keeps its best
	// round: on a shared machine another tenant's burst then spoils one
	// round of a setting rather than the whole setting.
	for round := range rounds {
		i := 0
		for _, t := range threads {
			for _, w := range workers {
				// The service's CPU pool with these threads and workers.
				c := cfg
				c.CPUThreads, c.Workers = t, w
				cs, err := newCPUScorer(ctx, rt, c, m, nil)
				if err != nil {
					return nil, err
				}
				ts := cs.plain
				// Warm-up on the smallest event, so first-run allocation
				// in ORT is not charged to one setting.
				_, err = ts.Score(ctx, evs[:1])
				var run measure.Run[schema.ScoredTranscript]
				if err == nil {
					run, err = measure.Chunks(ctx, evs[1:], measure.Every(len(evs)-1), ts.Score)
				}
				cs.close()
				if err != nil {
					return nil, fmt.Errorf("bench: scaling threads=%d workers=%d: %w", t, w, err)
				}
				pairs := 0
				for i := range evs[1:] {
					pairs += ts.PairCount(&evs[1+i])
				}
				pt := scalingPoint{Threads: t, Workers: w, Pairs: pairs, PairsPerSec: float64(pairs) / run.Wall.Seconds()}
				if round == 0 {
					out = append(out, pt)
				} else if pt.PairsPerSec > out[i].PairsPerSec {
					out[i] = pt
				}
				i++
			}
		}
	}
	return out, nil
}
