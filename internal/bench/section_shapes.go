package bench

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/scorer/scorer/internal/config"
	"github.com/scorer/scorer/internal/measure"
	"github.com/scorer/scorer/internal/scoring"
	"github.com/scorer/scorer/model"
	"github.com/scorer/scorer/schema"
)

// benchShapes is the shapes section: CPU stacks at every rows × tokens ×
// plan of the folder's sweep (the stand-in's: one round, --large-pairs).
func benchShapes(ctx context.Context, b *benchRun, f *folder) error {
	pairs, rounds := b.bf.shapePairs, b.bf.shapeRounds
	if f.large {
		pairs, rounds = b.bf.largePairs, 1
	}
	evs := scalingEvents(f.sample, pairs, f.labels)
	progress(b.e, "%s: CPU batch shapes, rows %v × tokens %v × plans %s, %d round(s)", f.name, f.rows, f.tokens, b.bf.shapePlans, rounds)
	end := b.mt.begin(f.span("shapes"))
	shapes, err := runShapes(ctx, b.rt, f.cfg, f.m, evs, f.rows, f.tokens, b.plans, rounds)
	f.pr.Shapes = shapes
	end()
	return err
}

// shapePoint is scoring throughput at one shape.
type shapePoint struct {
	cpuShape
	Pairs       int     `json:"pairs"`
	PairsPerSec float64 `json:"pairs_per_sec"`
	// PairsPerCPUSec is pairs over the process's CPU time (all threads):
	// on a machine shared with other work it moves far less than wall
	// time, so it is the one to choose shapes by there.
	PairsPerCPUSec float64 `json:"pairs_per_cpu_sec"`
}

// runShapes measures every rows × tokens × (workers, threads) setting on
// the same events in interleaved rounds, keeping each setting's best round
// by wall time and by CPU time (a burst from another tenant then spoils
// one round, not a setting).
func runShapes(ctx context.Context, rt *scoring.Runtime, cfg config.Config, m *model.Model, evs []schema.TranscriptEvent, rows, tokens []int, plans []cpuShape, rounds int) ([]shapePoint, error) {
	var out []shapePoint
	for round := range rounds {
		i := 0
		for _, p := range plans {
			for _, t := range tokens {
				for _, r := range rows {
					s := cpuShape{Rows: r, Tokens: t, Workers: p.Workers, Threads: p.Threads}
					pt, err := timeShape(ctx, rt, cfg, m, evs, s)
					if err != nil {
						return nil, fmt.Errorf("bench: shape %+v: %w", s, err)
					}
					if round == 0 {
						out = append(out, pt)
					} else {
						out[i].PairsPerSec = max(out[i].PairsPerSec, pt.PairsPerSec)
						out[i].PairsPerCPUSec = max(out[i].PairsPerCPUSec, pt.PairsPerCPUSec)
					}
					i++
				}
			}
		}
	}
	return out, nil
}

// timeShape scores evs[1:] in one call (the engine sees every pair at
// once, as under a backlog) after a warm-up on evs[0].
func timeShape(ctx context.Context, rt *scoring.Runtime, cfg config.Config, m *model.Model, evs []schema.TranscriptEvent, s cpuShape) (shapePoint, error) {
	cs, err := newCPUScorer(ctx, rt, s.apply(cfg), m, nil)
	if err != nil {
		return shapePoint{}, err
	}
	defer cs.close()
	if err := cs.warm(ctx, evs[0]); err != nil {
		return shapePoint{}, err
	}
	run, err := measure.Chunks(ctx, evs[1:], measure.Every(len(evs)-1), cs.ts.Score)
	if err != nil {
		return shapePoint{}, err
	}
	pairs := 0
	for i := range evs[1:] {
		pairs += cs.ts.PairCount(&evs[1+i])
	}
	return shapePoint{cpuShape: s, Pairs: pairs, PairsPerSec: float64(pairs) / run.Wall.Seconds(),
		PairsPerCPUSec: float64(pairs) / run.CPU.Seconds()}, nil
}

// parsePlans reads "WORKERSxTHREADS,…", e.g. "2x1,1x2".
func parsePlans(s string) ([]cpuShape, error) {
	var out []cpuShape
	for _, p := range config.SplitList(s, ",") {
		w, t, ok := strings.Cut(p, "x")
		wn, err1 := strconv.Atoi(w)
		tn, err2 := strconv.Atoi(t)
		if !ok || err1 != nil || err2 != nil || wn <= 0 || tn <= 0 {
			return nil, fmt.Errorf("%q is not WORKERSxTHREADS", p)
		}
		out = append(out, cpuShape{Workers: wn, Threads: tn})
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("empty list")
	}
	return out, nil
}
