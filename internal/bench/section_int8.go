package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/scorer/scorer/internal/compare"
	"github.com/scorer/scorer/internal/config"
	"github.com/scorer/scorer/internal/scoring"
	"github.com/scorer/scorer/schema"
)

// benchInt8 is the int8 section: CPU stacks on model.onnx and int8File,
// alternating rounds (the stand-in's: one round, --large-pairs).
func benchInt8(ctx context.Context, b *benchRun, f *folder) error {
	n, rounds := b.bf.int8Pairs, b.bf.int8Rounds
	if f.large {
		n, rounds = b.bf.largePairs, 1
	}
	evs := scalingEvents(f.sample, n, f.labels)
	progress(b.e, "%s: fp32 vs int8 (%s), %d transcripts", f.name, int8File, len(evs))
	end := b.mt.begin(f.span("int8"))
	res, err := runInt8(ctx, b.rt, f.cfg, f.dir, evs, rounds)
	f.pr.Int8 = res
	end()
	return err
}

// int8Result is fp32 against the folder's int8 export on the same events.
type int8Result struct {
	File            string  `json:"int8_file"`
	Pairs           int     `json:"pairs"`
	FP32PairsPerSec float64 `json:"fp32_pairs_per_sec"`
	Int8PairsPerSec float64 `json:"int8_pairs_per_sec"`
	Speedup         float64 `json:"speedup"`
	MaxAbsDiff      float64 `json:"max_abs_diff"`
	P99AbsDiff      float64 `json:"p99_abs_diff"`
	Agreement05     float64 `json:"agreement_at_0_5"`
	AgreementThresh float64 `json:"agreement_at_threshold"`
	Threshold       float64 `json:"threshold"`
}

// runInt8 scores evs with the folder's fp32 and int8 graphs on CPU pools of
// the default shape, alternating over rounds (each keeps its best), and
// compares their scores with internal/compare. It returns nil when the
// folder has no int8 file.
func runInt8(ctx context.Context, rt *scoring.Runtime, cfg config.Config, dir string, evs []schema.TranscriptEvent, rounds int) (*int8Result, error) {
	if _, err := os.Stat(filepath.Join(dir, int8File)); err != nil {
		return nil, nil
	}
	var runs [2]compare.Run
	for round := range rounds {
		for i, file := range []string{"model.onnx", int8File} {
			c := cfg
			c.ModelDir, c.ModelFile = dir, file
			m, err := scoring.LoadModel(c)
			if err != nil {
				return nil, err
			}
			cs, err := newCPUScorer(ctx, rt, c, m, nil)
			if err != nil {
				return nil, err
			}
			err = cs.warm(ctx, evs[0])
			var r compare.Run
			if err == nil {
				r, err = compare.ScoreTranscripts(ctx, file, cs.ts, evs, 8)
			}
			cs.close()
			if err != nil {
				return nil, fmt.Errorf("bench: int8, %s: %w", file, err)
			}
			if round == 0 || r.Seconds < runs[i].Seconds {
				runs[i] = r
			}
		}
	}
	res := &int8Result{File: int8File, Threshold: cfg.Threshold}
	for _, t := range []float64{0.5, cfg.Threshold} {
		rep, err := compare.Compare(runs[0], runs[1], compare.Options{Threshold: t})
		if err != nil {
			return nil, err
		}
		res.Pairs, res.MaxAbsDiff, res.P99AbsDiff = rep.Pairs, rep.MaxAbsDiff, rep.P99AbsDiff
		res.FP32PairsPerSec, res.Int8PairsPerSec = rep.A.PairsPerSec, rep.B.PairsPerSec
		if t == 0.5 {
			res.Agreement05 = rep.Agreement
		} else {
			res.AgreementThresh = rep.Agreement
		}
	}
	res.Speedup = res.Int8PairsPerSec / res.FP32PairsPerSec
	return res, nil
}
