package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/scorer/scorer/internal/cli"
	"github.com/scorer/scorer/internal/config"
	"github.com/scorer/scorer/internal/fanout"
	"github.com/scorer/scorer/internal/scoring"
	"github.com/scorer/scorer/model"
	"github.com/scorer/scorer/schema"
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

// procResult is one child's wall time, CPU time (getrusage of the reaped
// child) and peak resident set (its VmHWM, polled while it runs).
type procResult struct {
	seconds, cpuSeconds float64
	peakRSSMiB          float64
	stdout              []byte
}

// runProc runs a command to completion and measures it.
func runProc(ctx context.Context, env []string, name string, args ...string) (procResult, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = append(os.Environ(), env...)
	var out bytes.Buffer
	errb := &tailLog{}
	cmd.Stdout, cmd.Stderr = &out, errb
	t0 := time.Now()
	if err := cmd.Start(); err != nil {
		return procResult{}, fmt.Errorf("%s: %w", filepath.Base(name), err)
	}
	// The peak resident set is polled from /proc/PID/status (VmHWM, the
	// child's own address space once it has exec'd, which Start waits
	// for), not taken from wait4's ru_maxrss: Go starts children with
	// vfork, and Linux carries the parent's high-water mark across exec
	// into ru_maxrss, so every child smaller than this process reported
	// this process's peak.
	stopPeak := watchPeak(cmd.Process.Pid, peakPoll)
	err := cmd.Wait()
	d := time.Since(t0)
	hwmKiB := stopPeak()
	if err != nil {
		return procResult{}, fmt.Errorf("%s %s: %w: %s", filepath.Base(name), strings.Join(args, " "), err, errb.String())
	}
	r := procResult{seconds: d.Seconds(), stdout: out.Bytes(), peakRSSMiB: float64(hwmKiB) / 1024}
	if ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
		r.cpuSeconds = time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
	}
	return r, nil
}

// peakPoll is how often runProc reads a child's peak resident set; a rise
// in the child's last peakPoll before it exits can be missed.
const peakPoll = 20 * time.Millisecond

// wholeProcInputs writes the typical and long inputs for one model folder
// into dir: typical is real transcript sentences (the first sentences of
// transcripts spread over the corpus's size distribution, up to sentences
// in all); long joins consecutive real sentences until each premise is
// about 480 tokens, so a pair with its hypothesis is ~490–500 tokens.
func wholeProcInputs(dir string, m *model.Model, corpus []corpusLine, sentences, longSentences int) (typical, long string, err error) {
	sample := spreadSample(corpus, 8)
	per := (sentences + len(sample) - 1) / len(sample)
	var lines [][]byte
	left := sentences
	for _, l := range sample {
		ev := l.ev
		var s []string
		for _, sec := range ev.SectionNames() {
			s = append(s, ev.Sections[sec]...)
		}
		s = s[:min(len(s), per, left)]
		left -= len(s)
		ev.Sections = map[string][]string{"FILT_MD": s}
		b, err := json.Marshal(ev)
		if err != nil {
			return "", "", err
		}
		lines = append(lines, b)
		if left == 0 {
			break
		}
	}
	typical = filepath.Join(dir, "typical.jsonl")
	if err := os.WriteFile(typical, append(bytes.Join(lines, []byte("\n")), '\n'), 0o644); err != nil {
		return "", "", err
	}

	var longs []string
	for _, l := range bySize(corpus) {
		if len(longs) == longSentences {
			break
		}
		var cur []string
		n := 0
		for _, sec := range l.ev.SectionNames() {
			for _, s := range l.ev.Sections[sec] {
				ids, err := m.Tokenizer.Encode(s)
				if err != nil {
					return "", "", err
				}
				cur, n = append(cur, s), n+len(ids)
				if n >= 480 {
					longs = append(longs, strings.Join(cur, " "))
					cur, n = nil, 0
					if len(longs) == longSentences {
						break
					}
				}
			}
			if len(longs) == longSentences {
				break
			}
		}
	}
	if len(longs) < longSentences {
		return "", "", fmt.Errorf("bench: the corpus gave %d long sentences, want %d", len(longs), longSentences)
	}
	b, err := json.Marshal(schema.TranscriptEvent{CallID: "BENCH-LONG", EntityID: "BENCH", Sections: map[string][]string{"FILT_MD": longs}})
	if err != nil {
		return "", "", err
	}
	long = filepath.Join(dir, "long.jsonl")
	return typical, long, os.WriteFile(long, append(b, '\n'), 0o644)
}

// inputStats is the pair count and pair lengths of an input file under m.
func inputStats(path string, m *model.Model, labels fanout.LabelConfig) (pairs int, mean float64, maxLen int, err error) {
	lines, err := loadCorpus(path, schema.DefaultLimits())
	if err != nil {
		return 0, 0, 0, err
	}
	var hyps [][]int32
	for _, h := range labels.Hypotheses() {
		ids, err := m.Tokenizer.Encode(h)
		if err != nil {
			return 0, 0, 0, err
		}
		hyps = append(hyps, ids)
	}
	total := 0
	for _, l := range lines {
		for _, sents := range l.ev.Sections {
			for _, s := range sents {
				ids, err := m.Tokenizer.Encode(s)
				if err != nil {
					return 0, 0, 0, err
				}
				for _, h := range hyps {
					n := m.Tokenizer.EncodePair(ids, h, m.MaxLength).Len()
					pairs, total, maxLen = pairs+1, total+n, max(maxLen, n)
				}
			}
		}
	}
	if pairs > 0 {
		mean = float64(total) / float64(pairs)
	}
	return pairs, mean, maxLen, nil
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

// readyzRun starts `scorer run` on the in-memory broker with env and
// returns the seconds from exec until /readyz answers ready (model loaded,
// broker reachable, group joined), then stops it with SIGTERM.
func readyzRun(ctx context.Context, env []string, exe string) (float64, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	addr := ln.Addr().String()
	ln.Close()
	cmd := exec.CommandContext(ctx, exe, "run")
	cmd.Env = append(append(os.Environ(), env...), "KAFKA_BROKERS=embedded", "METRICS_ADDR="+addr)
	errb := &tailLog{}
	cmd.Stdout, cmd.Stderr = errb, errb
	t0 := time.Now()
	if err := cmd.Start(); err != nil {
		return 0, fmt.Errorf("scorer run: %w", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	stop := func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(time.Minute):
			_ = cmd.Process.Kill()
			<-exited
		}
	}
	client := &http.Client{Timeout: time.Second}
	for {
		select {
		case err := <-exited:
			return 0, fmt.Errorf("scorer run exited before it was ready: %v: %s", err, errb.String())
		case <-ctx.Done():
			stop()
			return 0, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
		resp, err := client.Get("http://" + addr + "/readyz")
		if err != nil {
			continue
		}
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			d := time.Since(t0)
			stop()
			return d.Seconds(), nil
		}
	}
}

// rawLoopRun runs the raw loop on input file in, as o's scorer runs.
func rawLoopRun(ctx context.Context, o wholeProcOpts, in string) (procResult, error) {
	return runProc(ctx, nil, "node", o.rawLoop, "--model", o.dir, "--model-file", o.graph, "--in", in,
		"--labels", strings.Join(o.cfg.Labels, ","), "--template", o.cfg.HypothesisTemplate)
}

// findRawLoop returns tools/rawloop/rawloop.mjs when node and the loop's
// npm packages are installed (`make bench` installs them), else why not.
func findRawLoop() (string, string) {
	if _, err := exec.LookPath("node"); err != nil {
		return "", "node is not on PATH"
	}
	script, err := config.ResolvePath("tools/rawloop/rawloop.mjs")
	if err != nil {
		return "", "tools/rawloop/rawloop.mjs not found"
	}
	if _, err := os.Stat(filepath.Join(filepath.Dir(script), "node_modules", "onnxruntime-node")); err != nil {
		return "", "tools/rawloop has no node_modules (run `make rawloop`)"
	}
	return script, ""
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

// rawLoopOnce is findRawLoop's answer, asked (and a missing loop said)
// once per run for both whole-process sections.
func (b *benchRun) rawLoopOnce() (path, note string) {
	if !b.rawLooked {
		b.rawLoop, b.rawNote = findRawLoop()
		b.rawLooked = true
		if b.rawNote != "" {
			progress(b.e, "whole process: no raw loop (%s); scorer score rows only", b.rawNote)
		}
	}
	return b.rawLoop, b.rawNote
}
