package bench

import (
	"context"
	"fmt"
	"hash/fnv"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/rs/zerolog"
	"github.com/scorer/scorer/gpupool"
	"github.com/scorer/scorer/internal/compare"
	"github.com/scorer/scorer/internal/config"
	"github.com/scorer/scorer/internal/scoring"
	"github.com/scorer/scorer/model"
	"github.com/scorer/scorer/model/scorecache"
	"github.com/scorer/scorer/schema"
)

// perfReport holds the sections about doing less work per pair: CPU batch
// shapes, the score cache on a revision workload, and int8 against fp32.
// One per model folder, the production-size stand-in included.
type perfReport struct {
	Model    string          `json:"model"`
	Shapes   []shapePoint    `json:"cpu_batch_shapes,omitempty"`
	Revision *revisionResult `json:"revision,omitempty"`
	Int8     *int8Result     `json:"int8,omitempty"`
}

// cpuShape is one CPU pool configuration.
type cpuShape struct {
	Rows    int `json:"max_batch_rows"`
	Tokens  int `json:"max_batch_tokens"`
	Workers int `json:"workers"`
	Threads int `json:"intra_op_threads"`
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

// apply puts s's batch shape, workers and threads in place of cfg's: the
// CPU caps too, so the pool runs exactly s.
func (s cpuShape) apply(cfg config.Config) config.Config {
	cfg.MaxBatchTokens, cfg.CPUMaxBatchTokens = s.Tokens, s.Tokens
	cfg.MaxBatchRows, cfg.CPUMaxBatchRows = s.Rows, s.Rows
	cfg.Workers, cfg.CPUThreads = s.Workers, s.Threads
	return cfg
}

// cpuScorer is a CPU pool with a TranscriptScorer over it, optionally
// through a score cache.
type cpuScorer struct {
	stack *scoring.Stack
	pool  *gpupool.Pool
	ts    *model.TranscriptScorer
	plain *model.TranscriptScorer // without the cache, for the warm-up
}

// newCPUScorer opens the stack the service builds with DEVICE=cpu (its
// batch shape, CPU plan and memory budget, from cfg) on rt and m, with
// cache as its score cache (nil: none, whatever SCORE_CACHE_BYTES says:
// these sections measure the engine, and revision brings its own caches).
func newCPUScorer(ctx context.Context, rt *scoring.Runtime, cfg config.Config, m *model.Model, cache *scorecache.Cache) (*cpuScorer, error) {
	cfg.Device = string(gpupool.ModeCPU)
	stack, err := scoring.Open(ctx, cfg, zerolog.Nop(), nil, scoring.OnRuntime(rt), scoring.WithModel(m), scoring.WithCache(cache))
	if err != nil {
		return nil, err
	}
	cs := &cpuScorer{stack: stack, pool: stack.Pool, ts: stack.Scorer}
	// The warm-up must not fill the cache the measurement reads: a second
	// scorer over the same pool, without it.
	if cs.plain, err = model.NewTranscriptScorer(stack.Model, stack.Labels, stack.Pool); err != nil {
		_ = stack.Close(context.Background())
		return nil, err
	}
	return cs, nil
}

// warm scores a few sentences untimed, without the cache, so first-run
// allocation in ORT is charged to no measurement.
func (cs *cpuScorer) warm(ctx context.Context, ev schema.TranscriptEvent) error {
	w := ev
	w.Sections = map[string][]string{}
	for name, sents := range ev.Sections {
		w.Sections[name] = sents[:min(len(sents), 16)]
	}
	_, err := cs.plain.Score(ctx, []schema.TranscriptEvent{w})
	return err
}

func (cs *cpuScorer) close() { _ = cs.stack.Close(context.Background()) }

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
	t0, cpu0 := time.Now(), cpuTime()
	if _, err := cs.ts.Score(ctx, evs[1:]); err != nil {
		return shapePoint{}, err
	}
	d, cpu := time.Since(t0), cpuTime()-cpu0
	pairs := 0
	for i := range evs[1:] {
		pairs += cs.ts.PairCount(&evs[1+i])
	}
	return shapePoint{cpuShape: s, Pairs: pairs, PairsPerSec: float64(pairs) / d.Seconds(),
		PairsPerCPUSec: float64(pairs) / cpu.Seconds()}, nil
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

// revisionResult is the score cache on a revision workload: every
// transcript arrives in several versions, each with a share of its
// sentences edited, scored with the cache off and on.
type revisionResult struct {
	Transcripts int     `json:"transcripts"`
	Versions    int     `json:"versions"`
	EditShare   float64 `json:"edit_share"`
	Pairs       int     `json:"pairs"`
	// InferredOff and InferredOn are pairs that reached inference.
	InferredOff    uint64  `json:"inferred_off"`
	InferredOn     uint64  `json:"inferred_on"`
	Saved          float64 `json:"pairs_saved"`
	SecondsOff     float64 `json:"seconds_off"`
	SecondsOn      float64 `json:"seconds_on"`
	PairsPerSecOff float64 `json:"pairs_per_sec_off"`
	PairsPerSecOn  float64 `json:"pairs_per_sec_on"`
	Speedup        float64 `json:"speedup"`
	// CPUSecondsOff and CPUSecondsOn are process CPU time (all threads);
	// CPUSpeedup compares pairs per CPU-second, which other tenants of a
	// shared machine disturb much less than wall time.
	CPUSecondsOff float64 `json:"cpu_seconds_off"`
	CPUSecondsOn  float64 `json:"cpu_seconds_on"`
	CPUSpeedup    float64 `json:"cpu_speedup"`
	Rounds        int     `json:"rounds"`
	CacheCapBytes int64   `json:"cache_cap_bytes"`
	CacheBytes    int64   `json:"cache_bytes"`
	CacheEntries  int64   `json:"cache_entries"`
	// The capped run repeats the workload with a cache far smaller than
	// its distinct pairs: it must evict, stay at its cap, and RSS must
	// stay flat once the cap is reached.
	CappedCapBytes  int64     `json:"capped_cap_bytes"`
	CappedBytes     int64     `json:"capped_bytes"`
	CappedEvictions int64     `json:"capped_evictions"`
	CappedInferred  uint64    `json:"capped_inferred"`
	CappedRSSMiB    []float64 `json:"capped_rss_mib_after_each_version"`
	SavedTarget     float64   `json:"pairs_saved_target"`
	SpeedupTarget   float64   `json:"speedup_target"`
	OK              bool      `json:"ok"`
}

// revisionWorkload is every event in versions versions: version 1 as is,
// each later one editing a share of the previous version's sentences, in
// arrival order (all first versions, then all second versions, …). Edits
// are chosen by a hash of (call_id, version, sentence), so runs repeat.
func revisionWorkload(evs []schema.TranscriptEvent, versions int, share float64) [][]schema.TranscriptEvent {
	out := make([][]schema.TranscriptEvent, versions)
	prev := evs
	for v := range versions {
		cur := make([]schema.TranscriptEvent, len(prev))
		for i, ev := range prev {
			ev.VersionID = strconv.Itoa(v + 1)
			if v > 0 {
				secs := make(map[string][]string, len(ev.Sections))
				for name, sents := range ev.Sections {
					s := append([]string(nil), sents...)
					for j := range s {
						h := fnv.New64a()
						fmt.Fprintf(h, "%s/%d/%s/%d", ev.CallID, v, name, j)
						if float64(h.Sum64()%10000) < share*10000 {
							s[j] = editSentence(s[j], v)
						}
					}
					secs[name] = s
				}
				ev.Sections = secs
			}
			cur[i] = ev
		}
		out[v] = cur
		prev = cur
	}
	return out
}

// editSentence is a correction as a transcript editor makes them: a word
// fixed, here the last one doubled with a version mark.
func editSentence(s string, v int) string {
	s = strings.TrimRight(s, ".?! ")
	if i := strings.LastIndexByte(s, ' '); i >= 0 {
		return s[:i] + " " + s[i+1:] + fmt.Sprintf(" (rev %d).", v)
	}
	return s + fmt.Sprintf(" (rev %d).", v)
}

// runRevision scores the workload through a CPU pool, chunk transcripts
// per call as the consumer batches them: cache off and on at capBytes in
// alternating rounds (each keeps its best), then once at cappedBytes.
func runRevision(ctx context.Context, rt *scoring.Runtime, cfg config.Config, m *model.Model, evs []schema.TranscriptEvent, versions int, share float64, capBytes, cappedBytes int64, rounds int) (*revisionResult, error) {
	work := revisionWorkload(evs, versions, share)
	r := &revisionResult{Transcripts: len(evs), Versions: versions, EditShare: share, CacheCapBytes: capBytes,
		CappedCapBytes: cappedBytes, SavedTarget: revisionSavedTarget.bound, SpeedupTarget: revisionSpeedTarget.bound}
	for _, v := range work {
		for i := range v {
			r.Pairs += v[i].SentenceCount() * len(cfg.Labels)
		}
	}
	chunk := max(cfg.BatchMaxMessages, 1)
	run := func(cache *scorecache.Cache, after func()) (inferred uint64, wall, cpu time.Duration, err error) {
		cs, err := newCPUScorer(ctx, rt, cfg, m, cache)
		if err != nil {
			return 0, 0, 0, err
		}
		defer cs.close()
		if err := cs.warm(ctx, evs[0]); err != nil {
			return 0, 0, 0, err
		}
		before := cs.pool.Stats().Pairs
		t0, cpu0 := time.Now(), cpuTime()
		for _, v := range work {
			for lo := 0; lo < len(v); lo += chunk {
				if _, err := cs.ts.Score(ctx, v[lo:min(lo+chunk, len(v))]); err != nil {
					return 0, 0, 0, err
				}
			}
			if after != nil {
				after()
			}
		}
		return cs.pool.Stats().Pairs - before, time.Since(t0), cpuTime() - cpu0, nil
	}
	r.Rounds = rounds
	for round := range rounds {
		inferred, wall, cpu, err := run(nil, nil)
		if err != nil {
			return nil, fmt.Errorf("bench: revision, cache off: %w", err)
		}
		if round == 0 || wall.Seconds() < r.SecondsOff {
			r.SecondsOff = wall.Seconds()
		}
		if round == 0 || cpu.Seconds() < r.CPUSecondsOff {
			r.CPUSecondsOff = cpu.Seconds()
		}
		r.InferredOff = inferred
		// A fresh cache each round: every round measures the same cold
		// start on version 1.
		cache, err := scorecache.New(capBytes, nil)
		if err != nil {
			return nil, err
		}
		if inferred, wall, cpu, err = run(cache, nil); err != nil {
			return nil, fmt.Errorf("bench: revision, cache on: %w", err)
		}
		if round == 0 || wall.Seconds() < r.SecondsOn {
			r.SecondsOn = wall.Seconds()
		}
		if round == 0 || cpu.Seconds() < r.CPUSecondsOn {
			r.CPUSecondsOn = cpu.Seconds()
		}
		r.InferredOn = inferred
		st := cache.Stats()
		r.CacheBytes, r.CacheEntries = st.Bytes, st.Entries
	}
	capped, err := scorecache.New(cappedBytes, nil)
	if err != nil {
		return nil, err
	}
	r.CappedInferred, _, _, err = run(capped, func() {
		if pm, err := readProcMemory(os.Getpid()); err == nil {
			r.CappedRSSMiB = append(r.CappedRSSMiB, float64(pm.RSSKiB)/1024)
		}
	})
	if err != nil {
		return nil, fmt.Errorf("bench: revision, capped cache: %w", err)
	}
	st := capped.Stats()
	r.CappedBytes, r.CappedEvictions = st.Bytes, st.Evictions
	r.PairsPerSecOff = float64(r.Pairs) / r.SecondsOff
	r.PairsPerSecOn = float64(r.Pairs) / r.SecondsOn
	r.Speedup = r.PairsPerSecOn / r.PairsPerSecOff
	r.CPUSpeedup = r.CPUSecondsOff / r.CPUSecondsOn
	r.Saved = 1 - float64(r.InferredOn)/float64(r.InferredOff)
	r.OK = revisionSavedTarget.ok(r.Saved) && revisionSpeedTarget.ok(max(r.Speedup, r.CPUSpeedup))
	return r, nil
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

// int8File is the quantized graph the bench compares against model.onnx.
const int8File = "onnx/model_quantized.onnx"

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
				r, err = compare.Score(ctx, file, cs.ts, evs, 8)
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
