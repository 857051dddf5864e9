package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"github.com/scorer/scorer/internal/cli"
	"github.com/scorer/scorer/internal/config"
	"github.com/scorer/scorer/internal/scoring"
	"github.com/scorer/scorer/model"
)

// wholeProcess is `scorer score` against an independent raw loop
// (tools/rawloop: Hugging Face tokenizers and onnxruntime-node, length-sorted
// batches of 16, ORT's default session options) on the same input file, each
// a whole process from exec to exit, so the model's load counts: the
// comparison a user makes with a stopwatch. Rounds alternate the two (A B A
// B) and each side keeps its best wall time and its worst peak RSS (the
// peak is what sizes a pod).
type wholeProcess struct {
	Model string `json:"model"`
	Graph string `json:"graph"` // the ONNX file, relative to the model folder
	Input string `json:"input"` // "typical" (real transcript sentences) or "long" (~500-token sentences)
	Pairs int    `json:"pairs"`
	// MeanPairTokens and MaxPairTokens describe the input as our tokenizer
	// sees it (premise with one label hypothesis).
	MeanPairTokens float64 `json:"mean_pair_tokens"`
	MaxPairTokens  int     `json:"max_pair_tokens"`
	Rounds         int     `json:"rounds"`

	ScorerSeconds     float64 `json:"scorer_seconds"`
	ScorerPairsPerSec float64 `json:"scorer_pairs_per_sec"`
	// ScorerNetPairsPerSec leaves the graph's start-up out (pairs over wall
	// time less the one-sentence run's), where a start-up was measured:
	// the scoring rate a long-running service sees.
	ScorerNetPairsPerSec float64 `json:"scorer_net_pairs_per_sec,omitempty"`
	ScorerPeakRSSMiB     float64 `json:"scorer_peak_rss_mib"`
	RawSeconds           float64 `json:"raw_seconds,omitempty"`
	RawPairsPerSec       float64 `json:"raw_pairs_per_sec,omitempty"`
	RawPeakRSSMiB        float64 `json:"raw_peak_rss_mib,omitempty"`
	// SpeedRatio is scorer pairs/s over the raw loop's; RSSRatio scorer peak
	// RSS over the raw loop's.
	SpeedRatio float64 `json:"speed_ratio,omitempty"`
	RSSRatio   float64 `json:"rss_ratio,omitempty"`
	// RawNote says why there is no raw-loop figure (no node, say).
	RawNote string `json:"raw_note,omitempty"`
	// ScorerCPUSeconds and RawCPUSeconds are each side's least user+system
	// CPU time over the rounds; CPURatio compares pairs per CPU-second,
	// which other tenants of a shared machine disturb far less than wall
	// time (it does not credit using more cores, only using them well).
	ScorerCPUSeconds float64 `json:"scorer_cpu_seconds"`
	RawCPUSeconds    float64 `json:"raw_cpu_seconds,omitempty"`
	CPURatio         float64 `json:"cpu_ratio,omitempty"`
	// The Unrewritten figures are `scorer score` with
	// REL_ATTENTION_REWRITE=false (the graph as exported), in the same
	// rounds, where asked (the production rows) and the scorer side ran
	// with the rewrite: what the relative-attention rewrite changes, with
	// everything else the scorer does the same. RewriteSpeedup is the
	// rewritten run's pairs/s over the unrewritten one's, RewriteRSSRatio
	// its peak RSS over the unrewritten one's.
	UnrewrittenSeconds    float64 `json:"unrewritten_seconds,omitempty"`
	UnrewrittenCPUSeconds float64 `json:"unrewritten_cpu_seconds,omitempty"`
	UnrewrittenPeakRSSMiB float64 `json:"unrewritten_peak_rss_mib,omitempty"`
	RewriteSpeedup        float64 `json:"rewrite_speedup,omitempty"`
	RewriteRSSRatio       float64 `json:"rewrite_rss_ratio,omitempty"`
}

// startupPoint is a graph's start-up: the wall time of `scorer score` on a
// one-sentence input (load, sessions, CPU memory calibration, one pair),
// first with an empty CPU_CALIBRATION_CACHE and GRAPH_CACHE (the first
// start on a machine), then with the calibration and the graph cache kept,
// as every later run has them.
type startupPoint struct {
	Model      string  `json:"model"`
	Graph      string  `json:"graph"`
	Seconds    float64 `json:"seconds"`
	PeakRSSMiB float64 `json:"peak_rss_mib"`
	// CachedSeconds and CachedPeakRSSMiB are the run's with both caches
	// kept.
	CachedSeconds    float64 `json:"cached_seconds,omitempty"`
	CachedPeakRSSMiB float64 `json:"cached_peak_rss_mib,omitempty"`
	// RawSeconds and RawPeakRSSMiB are the raw loop's on the same
	// sentence (issue 45, item 7): how fast ORT alone, with its default
	// session options, starts and scores one pair; zero without the loop.
	RawSeconds    float64 `json:"raw_seconds,omitempty"`
	RawPeakRSSMiB float64 `json:"raw_peak_rss_mib,omitempty"`
	// GraphCacheSeconds is the wall time of the run between the two, on
	// the same sentence with GRAPH_CACHE_WAIT=true: the first run ends
	// before its graph cache is written (a short run does), so this one
	// writes it, and the cached run and the rounds load it. ReadySeconds
	// is `scorer run`'s (in-memory broker) from exec to /readyz answering
	// ready, caches warm (issue 45, item 7).
	GraphCacheSeconds float64 `json:"graph_cache_seconds,omitempty"`
	ReadySeconds      float64 `json:"ready_seconds,omitempty"`
}

// wholeProcOpts are the whole-process comparison's settings for one folder.
type wholeProcOpts struct {
	dir, graph   string
	inputs       []string // "typical", "long"
	files        map[string]string
	rounds       int
	rawLoop      string // tools/rawloop/rawloop.mjs; empty: no raw loop
	rawNote      string
	startup      bool
	startupInput string
	// rewriteAB adds the unrewritten scorer to each round (see
	// wholeProcess.UnrewrittenSeconds).
	rewriteAB bool
	workDir   string
	cfg       config.Config
	m         *model.Model
}

// runWholeProcess measures `scorer score` (this binary, with the bench's
// configuration in its environment) and the raw loop on each input.
func runWholeProcess(ctx context.Context, e cli.Env, o wholeProcOpts) ([]wholeProcess, *startupPoint, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, nil, err
	}
	lib, err := config.ResolvePath(o.cfg.ORTLib)
	if err != nil {
		return nil, nil, err
	}
	// The graph's own, initially empty, calibration cache: the start-up's
	// first run measures and keeps it, and every later run (the second
	// start-up, the rounds) takes it, as runs after the first on a machine
	// do with the default CPU_CALIBRATION_CACHE.
	calDir, err := os.MkdirTemp(o.workDir, "calibration-")
	if err != nil {
		return nil, nil, err
	}
	// Likewise the graph's own GRAPH_CACHE, filled by the run after the
	// first start-up (GRAPH_CACHE_WAIT) and loaded by every run after it.
	graphDir, err := os.MkdirTemp(o.workDir, "graph-cache-")
	if err != nil {
		return nil, nil, err
	}
	// The rewrite setting is passed on explicitly: the bench's own flags
	// may have set it, and the A/B run below sets it off.
	env := []string{"ORT_LIB=" + lib, "LOG_LEVEL=warn", "DEVICE=" + o.cfg.Device, "CPU_CALIBRATION_CACHE=" + calDir, "GRAPH_CACHE=" + graphDir}
	out := filepath.Join(o.workDir, "scored.jsonl")
	run := func(rewrite bool, in string) (procResult, error) {
		env := append(env[:len(env):len(env)], "REL_ATTENTION_REWRITE="+strconv.FormatBool(rewrite))
		return runProc(ctx, env, exe, "score", "--model", o.dir, "--model-file", o.graph, "--in", in, "--out", out, "--progress", "off")
	}
	scorer := func(in string) (procResult, error) { return run(o.cfg.RelAttnRewrite, in) }
	ab := o.rewriteAB && o.cfg.RelAttnRewrite
	labels := o.cfg.LabelConfig()
	var sp *startupPoint
	if o.startup {
		progress(e, "%s: start-up, %s on one sentence", filepath.Base(o.dir), o.graph)
		r, err := scorer(o.startupInput)
		if err != nil {
			return nil, nil, err
		}
		sp = &startupPoint{Model: filepath.Base(o.dir), Graph: o.graph, Seconds: r.seconds, PeakRSSMiB: r.peakRSSMiB}
		progress(e, "%s: start-up, %s on one sentence: writing the graph cache", filepath.Base(o.dir), o.graph)
		wait := append(env[:len(env):len(env)], "GRAPH_CACHE_WAIT=true", "REL_ATTENTION_REWRITE="+strconv.FormatBool(o.cfg.RelAttnRewrite))
		if r, err = runProc(ctx, wait, exe, "score", "--model", o.dir, "--model-file", o.graph, "--in", o.startupInput, "--out", out, "--progress", "off"); err != nil {
			return nil, nil, err
		}
		sp.GraphCacheSeconds = r.seconds
		if r, err = scorer(o.startupInput); err != nil {
			return nil, nil, err
		}
		sp.CachedSeconds, sp.CachedPeakRSSMiB = r.seconds, r.peakRSSMiB
		progress(e, "%s: start-up, %s: scorer run until /readyz", filepath.Base(o.dir), o.graph)
		ready := append(env[:len(env):len(env)], "REL_ATTENTION_REWRITE="+strconv.FormatBool(o.cfg.RelAttnRewrite),
			"MODEL_DIR="+o.dir, "MODEL_FILE="+o.graph)
		if sp.ReadySeconds, err = readyzRun(ctx, ready, exe); err != nil {
			return nil, nil, err
		}
		if o.rawLoop != "" {
			progress(e, "%s: start-up, %s on one sentence: raw loop", filepath.Base(o.dir), o.graph)
			if r, err = rawLoopRun(ctx, o, o.startupInput); err != nil {
				return nil, nil, err
			}
			sp.RawSeconds, sp.RawPeakRSSMiB = r.seconds, r.peakRSSMiB
		}
	}
	if ab {
		// The unrewritten graph's calibration is its own (the memory key
		// names the rewrite): measured here, so its rounds keep it as the
		// rewritten ones do.
		progress(e, "%s: %s without the relative-attention rewrite, calibration run", filepath.Base(o.dir), o.graph)
		if _, err := run(false, o.startupInput); err != nil {
			return nil, nil, err
		}
	}
	// keep folds one round's run into a side's figures: its best wall and
	// CPU time, its worst peak.
	keep := func(round int, secs, cpu, rss *float64, r procResult) {
		if round == 0 || r.seconds < *secs {
			*secs = r.seconds
		}
		if round == 0 || r.cpuSeconds < *cpu {
			*cpu = r.cpuSeconds
		}
		*rss = max(*rss, r.peakRSSMiB)
	}
	var rows []wholeProcess
	for _, input := range o.inputs {
		in := o.files[input]
		w := wholeProcess{Model: filepath.Base(o.dir), Graph: o.graph, Input: input, Rounds: o.rounds, RawNote: o.rawNote}
		if w.Pairs, w.MeanPairTokens, w.MaxPairTokens, err = inputStats(in, o.m, labels); err != nil {
			return nil, nil, err
		}
		for round := range o.rounds {
			progress(e, "%s: %s, %s input (%d pairs), round %d/%d: scorer score", filepath.Base(o.dir), o.graph, input, w.Pairs, round+1, o.rounds)
			r, err := scorer(in)
			if err != nil {
				return nil, nil, err
			}
			keep(round, &w.ScorerSeconds, &w.ScorerCPUSeconds, &w.ScorerPeakRSSMiB, r)
			if ab {
				progress(e, "%s: %s, %s input, round %d/%d: scorer score, REL_ATTENTION_REWRITE=false", filepath.Base(o.dir), o.graph, input, round+1, o.rounds)
				if r, err = run(false, in); err != nil {
					return nil, nil, err
				}
				keep(round, &w.UnrewrittenSeconds, &w.UnrewrittenCPUSeconds, &w.UnrewrittenPeakRSSMiB, r)
			}
			if o.rawLoop == "" {
				continue
			}
			progress(e, "%s: %s, %s input, round %d/%d: raw loop", filepath.Base(o.dir), o.graph, input, round+1, o.rounds)
			r, err = rawLoopRun(ctx, o, in)
			if err != nil {
				return nil, nil, err
			}
			var rr struct {
				Pairs int `json:"pairs"`
			}
			if err := json.Unmarshal(bytes.TrimSpace(r.stdout), &rr); err != nil || rr.Pairs != w.Pairs {
				return nil, nil, fmt.Errorf("bench: the raw loop scored %d pairs of %s, we count %d (%v)", rr.Pairs, in, w.Pairs, err)
			}
			keep(round, &w.RawSeconds, &w.RawCPUSeconds, &w.RawPeakRSSMiB, r)
		}
		w.ScorerPairsPerSec = float64(w.Pairs) / w.ScorerSeconds
		if w.UnrewrittenSeconds > 0 {
			w.RewriteSpeedup = w.UnrewrittenSeconds / w.ScorerSeconds
			w.RewriteRSSRatio = w.ScorerPeakRSSMiB / w.UnrewrittenPeakRSSMiB
		}
		if w.RawSeconds > 0 {
			w.RawPairsPerSec = float64(w.Pairs) / w.RawSeconds
			w.SpeedRatio = w.ScorerPairsPerSec / w.RawPairsPerSec
			w.RSSRatio = w.ScorerPeakRSSMiB / w.RawPeakRSSMiB
			if w.ScorerCPUSeconds > 0 {
				w.CPURatio = w.RawCPUSeconds / w.ScorerCPUSeconds
			}
		}
		rows = append(rows, w)
	}
	return rows, sp, nil
}

// wholeJob is one model folder of the whole-process sections.
type wholeJob struct {
	dir     string
	graphs  []string
	inputs  []string
	rounds  int
	sents   int
	long    int
	startup bool
	section string // wholeproc or production
	// external re-saves dir's graphs with their weights in external
	// data files (model.WriteExternalData) and measures their start-up
	// alone: issue 35's inline vs external comparison.
	external bool
}

// runWholeJobs runs the whole-process comparison on each job's graphs in
// a temporary folder, appending the rows and start-ups to the report. It
// returns the production stand-in's folder name ("" when no job measured
// it inline).
func (b *benchRun) runWholeJobs(ctx context.Context, jobs []wholeJob) (prodName string, err error) {
	rawLoop, rawNote := b.rawLoopOnce()
	work, err := os.MkdirTemp("", "scorer-bench-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(work)
	one := filepath.Join(work, "one.jsonl")
	if err := os.WriteFile(one, []byte(`{"call_id":"BENCH-ONE","sections":{"FILT_MD":["Revenue grew in the quarter."]}}`+"\n"), 0o644); err != nil {
		return "", err
	}
	for i, j := range jobs {
		dir, err := config.ResolvePath(j.dir)
		if err != nil {
			return "", fmt.Errorf("bench: model dir: %w", err)
		}
		if j.external {
			if dir, err = externalCopy(dir, j.graphs, filepath.Join(work, fmt.Sprint(i, "-external"))); err != nil {
				return "", fmt.Errorf("bench: %w", err)
			}
		}
		c := b.cfg
		c.ModelDir, c.ModelFile = dir, ""
		m, err := scoring.LoadModel(c)
		if err != nil {
			return "", err
		}
		graphs := j.graphs
		if graphs == nil {
			rel, err := filepath.Rel(dir, m.ONNXPath)
			if err != nil {
				return "", err
			}
			graphs = []string{rel}
		}
		wd := filepath.Join(work, fmt.Sprint(i))
		if err := os.MkdirAll(wd, 0o755); err != nil {
			return "", err
		}
		var typical, long string
		if len(j.inputs) > 0 {
			if typical, long, err = wholeProcInputs(wd, m, b.corpus, j.sents, j.long); err != nil {
				return "", err
			}
		}
		for _, g := range graphs {
			if _, err := os.Stat(filepath.Join(dir, g)); err != nil {
				progress(b.e, "%s: no %s, skipped", filepath.Base(dir), g)
				continue
			}
			end := b.mt.begin(j.section)
			rows, sp, err := runWholeProcess(ctx, b.e, wholeProcOpts{
				dir: dir, graph: g, inputs: j.inputs, files: map[string]string{"typical": typical, "long": long},
				rounds: j.rounds, rawLoop: rawLoop, rawNote: rawNote, startup: j.startup, startupInput: one,
				workDir: wd, cfg: c, m: m, rewriteAB: j.section == "production",
			})
			end()
			if err != nil {
				return "", fmt.Errorf("bench: whole process, %s %s: %w", filepath.Base(dir), g, err)
			}
			if sp != nil {
				b.rep.Startup = append(b.rep.Startup, *sp)
				for i := range rows {
					// The rows ran with the calibration kept.
					if net := rows[i].ScorerSeconds - sp.CachedSeconds; net > 0 {
						rows[i].ScorerNetPairsPerSec = float64(rows[i].Pairs) / net
					}
				}
			}
			b.rep.WholeProcess = append(b.rep.WholeProcess, rows...)
		}
		if j.section == "production" && !j.external {
			prodName = filepath.Base(dir)
		}
	}
	return prodName, nil
}
