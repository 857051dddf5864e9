// Package bench is `scorer bench`, the benchmark harness (docs/benchmarks.md):
// the pipeline against raw ONNX Runtime, padding, tokenizer share, latency,
// memory under a backlog, CPU scaling, batch shapes, the revision workload
// and int8. Its scorers are the service's (scoring.Open, with wrappers that
// record batches), and its pipeline runs the service's Kafka side
// (internal/streaming: topics, producer, consumer) around them, so the
// numbers are the service's; nothing imports this package but the binary.
// Children (broker, scorer) are this same executable re-run with a
// subcommand, so it only works inside the scorer binary.
package bench

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/rs/zerolog"
	ort "github.com/yalue/onnxruntime_go"

	"github.com/scorer/scorer/internal/cli"
	"github.com/scorer/scorer/internal/config"
	"github.com/scorer/scorer/internal/scoring"
	"github.com/scorer/scorer/model/scorecache"
	"github.com/scorer/scorer/schema"
)

// benchFlags are `scorer bench`'s own flags; the service configuration
// (CPU_THREADS, BATCH_MAX_WAIT, DEVICE, …) comes from the same environment
// variables and flags as `scorer run`, so a benchmark measures a
// configuration the service can actually run with.
type benchFlags struct {
	modelDirs        string
	transcripts      string
	out              string
	cpuProfile       string
	limit            int
	latencyN         int
	latencyRate      float64
	memMultiples     string
	memDuration      time.Duration
	scalingPairs     int
	scalingThreads   string
	scalingWorkers   string
	scalingRounds    int
	skip             string
	pipelineDeadline time.Duration

	shapeRows    string
	shapeTokens  string
	shapePlans   string
	shapePairs   int
	shapeRounds  int
	revisionN    int
	revisionVers int
	revisionEdit float64
	revisionCap  int64
	revisionRnds int
	int8Pairs    int
	int8Rounds   int
	largeModel   string
	largePairs   int
	largeRows    string

	md             string
	from           string
	prodModel      string
	prodSentences  int
	prodLong       int
	prodRounds     int
	wholeSentences int
	wholeRounds    int
}

// Spec is `scorer bench` for its help and the docs.
var Spec = cli.Spec{
	Name: "bench", Synopsis: "[--model-dirs DIRS] [--transcripts FILE] [flags]",
	Summary: "run the benchmarks (make bench; docs/benchmarks.md)",
	About: "The benchmark harness (docs/benchmarks.md): per model folder, the Kafka-to-Kafka pipeline against raw " +
		"ONNX Runtime on the same batches, padding, tokenizer share, latency, memory under a backlog, CPU scaling and " +
		"batch shapes, the revision workload, int8, and whole processes against an independent raw loop. It builds " +
		"the service's scorer from the settings below, overriding only what a section varies; its pipeline runs " +
		"against a broker of its own, on the default topics. It prints numbers and fails only on errors.",
	Settings: config.Bench,
	Flags:    func(fs *flag.FlagSet) { new(benchFlags).register(fs) },
}

func (bf *benchFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&bf.modelDirs, "model-dirs", "", "comma-separated model folders to benchmark; empty = MODEL_DIR")
	fs.StringVar(&bf.transcripts, "transcripts", "../shared/data/transcripts/transcripts.jsonl", "TranscriptEvent JSONL corpus")
	fs.StringVar(&bf.out, "out", "", "write the results as JSON to this file; empty = none")
	fs.StringVar(&bf.cpuProfile, "cpuprofile", "", "write a CPU profile of each model's pipeline run to this file (model name inserted before the extension when there are several models)")
	fs.IntVar(&bf.limit, "transcripts-limit", 20, "transcripts in the throughput run, picked at evenly spaced quantiles of size")
	fs.IntVar(&bf.latencyN, "latency-transcripts", 15, "shortest transcripts produced at --latency-rate for the low-rate latency run")
	fs.Float64Var(&bf.latencyRate, "latency-rate", 1, "records per second of the low-rate latency run")
	fs.StringVar(&bf.memMultiples, "memory-multiples", "20,60", "backlog sizes for the memory run, as multiples of the in-flight limit (BATCH_MAX_MESSAGES × MAX_INFLIGHT_BATCHES)")
	fs.DurationVar(&bf.memDuration, "memory-duration", 25*time.Second, "how long the scorer process runs against each backlog")
	fs.IntVar(&bf.scalingPairs, "scaling-pairs", 1200, "pairs (at least) scored per threads × workers setting")
	fs.StringVar(&bf.scalingThreads, "scaling-threads", "1,2", "intra-op thread counts of the CPU scaling run")
	fs.StringVar(&bf.scalingWorkers, "scaling-workers", "1,2", "workers per device of the CPU scaling run")
	fs.IntVar(&bf.scalingRounds, "scaling-rounds", 2, "interleaved rounds of the CPU scaling run; each setting reports its best")
	fs.StringVar(&bf.skip, "skip", "", "comma-separated sections to skip: pipeline (with raw ORT, padding, tokenizer), latency, memory, scaling, shapes, revision, int8; large (the --large-model rows, which ignore the others); wholeproc (scorer score vs the raw loop on the small models); production (the --production-model rows)")
	fs.StringVar(&bf.shapeRows, "shape-rows", "8,16,32,64,256", "MAX_BATCH_ROWS values of the CPU batch-shape sweep")
	fs.StringVar(&bf.shapeTokens, "shape-tokens", "16384", "MAX_BATCH_TOKENS values of the CPU batch-shape sweep")
	fs.StringVar(&bf.shapePlans, "shape-plans", "2x1,1x2", "WORKERSxTHREADS settings of the CPU batch-shape sweep")
	fs.IntVar(&bf.shapePairs, "shape-pairs", 1200, "pairs (at least) scored per batch shape")
	fs.IntVar(&bf.shapeRounds, "shape-rounds", 2, "interleaved rounds of the batch-shape sweep; each shape reports its best")
	fs.IntVar(&bf.revisionN, "revision-transcripts", 6, "real transcripts in the revision workload (each arrives --revision-versions times)")
	fs.IntVar(&bf.revisionVers, "revision-versions", 3, "versions of each transcript in the revision workload")
	fs.Float64Var(&bf.revisionEdit, "revision-edit", 0.05, "share of sentences edited in each later version")
	fs.IntVar(&bf.revisionRnds, "revision-rounds", 2, "alternating cache off / on rounds of the revision workload; each keeps its best")
	fs.Int64Var(&bf.revisionCap, "revision-capped-bytes", 128<<10, "score cache cap of the revision workload's capped run (smaller than its distinct pairs, so it evicts)")
	fs.IntVar(&bf.int8Pairs, "int8-pairs", 1200, "pairs (at least) scored by fp32 and by int8 per model folder")
	fs.IntVar(&bf.int8Rounds, "int8-rounds", 2, "alternating fp32/int8 rounds; each keeps its best")
	fs.StringVar(&bf.largeModel, "large-model", "", "a production-size model folder (../shared/tools/large-model makes one; never commit it): adds its batch-shape and fp32/int8 rows; empty = none")
	fs.IntVar(&bf.largePairs, "large-pairs", 150, "pairs per measurement on --large-model")
	fs.StringVar(&bf.largeRows, "large-shape-rows", "8,16,64", "MAX_BATCH_ROWS values of --large-model's batch-shape sweep (one round, the largest --shape-tokens)")
	fs.DurationVar(&bf.pipelineDeadline, "run-timeout", 15*time.Minute, "deadline of each pipeline run")
	fs.StringVar(&bf.md, "md", "", "also write each section's table, headed by its run's date, CPU, cores, ONNX Runtime, models and how busy the machine was, into this Markdown file between its <!-- bench:SECTION:begin --> and <!-- bench:SECTION:end --> lines (blocks of sections not run are kept); empty = none")
	fs.StringVar(&bf.from, "from", "", "measure nothing: print the tables of this JSON report (one --out wrote) and, with --md, write its sections' blocks (less --skip), naming this file as their JSON")
	fs.StringVar(&bf.prodModel, "production-model", "", "a production-size model folder (make_deberta.py --size large --vocab 128100 --int8; `make bench` builds one under .deps): whole-process rows for model.onnx and onnx/model_quantized.onnx on typical and long inputs, with start-up; empty = none")
	fs.IntVar(&bf.prodSentences, "production-sentences", 100, "real sentences in --production-model's typical input (× labels = pairs)")
	fs.IntVar(&bf.prodLong, "production-long", 8, "~500-token sentences in --production-model's long input (× labels = pairs)")
	fs.IntVar(&bf.prodRounds, "production-rounds", 1, "alternating scorer / raw loop rounds per --production-model row; each keeps its best time and worst peak RSS")
	fs.IntVar(&bf.wholeSentences, "wholeproc-sentences", 4000, "real sentences in the small models' whole-process input (× labels = pairs)")
	fs.IntVar(&bf.wholeRounds, "wholeproc-rounds", 2, "alternating scorer / raw loop rounds per small-model whole-process row")
}

// Command is `scorer bench`: per model folder it measures the pipeline
// against raw ORT, padding, tokenizer cost, latency, memory under a backlog
// and CPU scaling, prints one table and writes it as JSON. It prints
// numbers; it passes or fails nothing except on errors.
func Command(ctx context.Context, e cli.Env, args []string) error {
	fs := Spec.FlagSet(e)
	var bf benchFlags
	bf.register(fs)
	cfg, err := Spec.Load(e, fs, args)
	if err != nil {
		return err
	}
	// The pool's and consumer's info lines would bury the table.
	log, err := cli.ReportLogger(e, fs, e.Stderr, cfg.LogLevel, cfg.LogFormat)
	if err != nil {
		return err
	}
	skip, err := skipSet(bf.skip)
	if err != nil {
		return err
	}
	if bf.from != "" {
		rep, err := readReport(bf.from)
		if err != nil {
			return fmt.Errorf("bench: --from: %w", err)
		}
		return report(e, rep, bf.md, bf.from, skip)
	}
	dirs := config.SplitList(bf.modelDirs, ",")
	if len(dirs) == 0 {
		dirs = []string{cfg.ModelDir}
	}
	threads, err := intList(bf.scalingThreads)
	if err != nil {
		return fmt.Errorf("bench: --scaling-threads: %w", err)
	}
	workers, err := intList(bf.scalingWorkers)
	if err != nil {
		return fmt.Errorf("bench: --scaling-workers: %w", err)
	}
	multiples, err := intList(bf.memMultiples)
	if err != nil {
		return fmt.Errorf("bench: --memory-multiples: %w", err)
	}

	path, err := config.ResolvePath(bf.transcripts)
	if err != nil {
		return fmt.Errorf("bench: --transcripts: %w", err)
	}
	progress(e, "loading %s", path)
	corpus, err := loadCorpus(path, cfg.Limits())
	if err != nil {
		return err
	}
	// ONNX Runtime and NVML for every scorer the sections open (scoring.Open
	// on rt), closed after the last one by the stacks' rule.
	rt, err := scoring.StartRuntime(cfg.ORTLib, log)
	if err != nil {
		return err
	}
	defer rt.Close()

	rows, err := intList(bf.shapeRows)
	if err != nil {
		return fmt.Errorf("bench: --shape-rows: %w", err)
	}
	tokens, err := intList(bf.shapeTokens)
	if err != nil {
		return fmt.Errorf("bench: --shape-tokens: %w", err)
	}
	plans, err := parsePlans(bf.shapePlans)
	if err != nil {
		return fmt.Errorf("bench: --shape-plans: %w", err)
	}
	if bf.revisionN <= 0 || bf.revisionVers < 2 || !(bf.revisionEdit > 0 && bf.revisionEdit < 1) || bf.revisionCap < scorecache.MinBytes {
		return fmt.Errorf("bench: --revision-transcripts must be > 0, --revision-versions >= 2, --revision-edit in (0, 1), --revision-capped-bytes >= %d", scorecache.MinBytes)
	}
	if bf.shapePairs <= 0 || bf.int8Pairs <= 0 || bf.largePairs <= 0 || bf.shapeRounds <= 0 || bf.int8Rounds <= 0 || bf.revisionRnds <= 0 {
		return errors.New("bench: --shape-pairs, --int8-pairs, --large-pairs and the --*-rounds flags must be > 0")
	}

	rep := benchReport{Machine: machineInfo(), Settings: benchSettingsOf(cfg, bf, len(corpus))}
	mt := newMeter()
	for _, d := range dirs {
		dir, err := config.ResolvePath(d)
		if err != nil {
			return fmt.Errorf("bench: model dir: %w", err)
		}
		mr, err := benchModel(ctx, e, rt, cfg, bf, log, mt, dir, corpus, len(dirs) > 1, skip, threads, workers, multiples)
		if err != nil {
			return fmt.Errorf("bench: %s: %w", filepath.Base(dir), err)
		}
		rep.Models = append(rep.Models, mr)
	}
	for _, pd := range perfDirs(dirs, bf.largeModel, skip) {
		dir, err := config.ResolvePath(pd.dir)
		if err != nil {
			return fmt.Errorf("bench: model dir: %w", err)
		}
		large := pd.large
		r, t := rows, tokens
		if large {
			// At ~11 pairs/s fp32 the full sweep would take an hour.
			if r, err = intList(bf.largeRows); err != nil {
				return fmt.Errorf("bench: --large-shape-rows: %w", err)
			}
			t = []int{slices.Max(tokens)}
		}
		pr, err := benchPerf(ctx, e, rt, cfg, bf, mt, dir, corpus, skip, large, r, t, plans)
		if err != nil {
			return fmt.Errorf("bench: %s: %w", filepath.Base(dir), err)
		}
		rep.Perf = append(rep.Perf, pr)
	}
	if err := benchWholeProcess(ctx, e, cfg, bf, mt, corpus, dirs, skip, &rep); err != nil {
		return err
	}
	rep.Sections = mt.report()
	if bf.out != "" {
		b, err := json.MarshalIndent(rep, "", "  ")
		if err != nil {
			return err
		}
		if err := os.WriteFile(bf.out, append(b, '\n'), 0o644); err != nil {
			return fmt.Errorf("bench: --out: %w", err)
		}
		progress(e, "wrote %s", bf.out)
	}
	return report(e, &rep, bf.md, bf.out, nil)
}

// report prints rep's tables and the conditions of each section and, with
// md, writes the sections' blocks into that Markdown file, naming jsonPath
// as the JSON that holds the run.
func report(e cli.Env, rep *benchReport, md, jsonPath string, skip map[string]bool) error {
	all := func(string) bool { return true }
	printMachine(e.Stdout, rep)
	fmt.Fprintln(e.Stdout)
	printTable(e.Stdout, rep, all)
	fmt.Fprintln(e.Stdout)
	printPerfTable(e.Stdout, rep.Perf, all)
	fmt.Fprintln(e.Stdout)
	printWholeTable(e.Stdout, rep, all)
	for _, s := range ranSections(rep) {
		if run, ok := rep.Sections[s]; ok {
			fmt.Fprintf(e.Stdout, "section %-10s %s, %.0f s, other processes' CPU %.1f s\n", s, spanText(run.Start, run.End), run.Seconds, run.OtherCPUSeconds)
		}
	}
	if md == "" {
		return nil
	}
	written, err := writeMarkdown(md, jsonPath, rep, skip)
	if err != nil {
		return fmt.Errorf("bench: --md: %w", err)
	}
	progress(e, "wrote the blocks of %s into %s", strings.Join(written, ", "), md)
	return nil
}

// benchModel runs every section for one model folder.
func benchModel(ctx context.Context, e cli.Env, rt *scoring.Runtime, cfg config.Config, bf benchFlags, log zerolog.Logger, mt *meter, dir string, corpus []corpusLine, several bool, skip map[string]bool, threads, workers, multiples []int) (modelReport, error) {
	cfg.ModelDir = dir
	m, err := scoring.LoadModel(cfg)
	if err != nil {
		return modelReport{}, err
	}
	mr := modelReport{Model: m.Name, SHA256: m.SHA256}
	labels := len(cfg.Labels)

	// 1–3: throughput run at saturation, its recorded batches replayed on
	// raw ORT, padding and tokenizer share from the same run.
	sample := spreadSample(corpus, bf.limit)
	recs, keys, evs := splitLines(sample)
	prof := ""
	if bf.cpuProfile != "" {
		prof = bf.cpuProfile
		if several {
			ext := filepath.Ext(prof)
			prof = strings.TrimSuffix(prof, ext) + "-" + m.Name + ext
		}
		mr.CPUProfile = prof
	}
	if skip["pipeline"] {
		return mr, nil
	}
	progress(e, "%s: pipeline, %d transcripts (%d pairs), as fast as possible", m.Name, len(sample), pairsOf(sample, labels))
	// A failed section fails the whole run, so only a finished span counts.
	endPipeline := mt.begin("pipeline")
	run, err := runPipeline(ctx, rt, cfg, m, log, pipelineOpts{records: recs, keys: keys, keep: true, timeout: bf.pipelineDeadline, profile: prof})
	if err != nil {
		return mr, fmt.Errorf("pipeline: %w", err)
	}
	progress(e, "%s: raw ORT replay of %d batches", m.Name, len(run.rec.batches))
	rawPairs, rawDur, rawCPU, err := replayRaw(ctx, scoring.SessionFactory(cfg, m), run.device, run.workers, run.rec.batches)
	if err != nil {
		return mr, fmt.Errorf("raw replay: %w", err)
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
	for _, b := range run.rec.batches {
		engine += b.dur
	}
	tp.EngineBusyShare = engine.Seconds() / run.wall.Seconds()
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
		return mr, err
	}
	mr.Tokenizer = tokenizerShare{tokenizerResult: tok, PipelineCPUSeconds: run.cpu.Seconds(), Target: tokenizerShareTarget.bound}
	mr.Tokenizer.Share = tok.Seconds / run.cpu.Seconds()
	mr.Tokenizer.OK = tokenizerShareTarget.ok(mr.Tokenizer.Share)
	mr.LatencySaturation = latencyOf(run.latencies)
	mr.LatencySaturation.Transcripts = len(sample)
	endPipeline()

	// 4: latency at a low steady rate.
	if !skip["latency"] {
		short := shortest(corpus, bf.latencyN)
		recs, keys, _ := splitLines(short)
		progress(e, "%s: latency, %d short transcripts (%d pairs) at %g/s", m.Name, len(short), pairsOf(short, labels), bf.latencyRate)
		end := mt.begin("latency")
		lr, err := runPipeline(ctx, rt, cfg, m, log, pipelineOpts{records: recs, keys: keys, rate: bf.latencyRate, timeout: bf.pipelineDeadline})
		end()
		if err != nil {
			return mr, fmt.Errorf("latency: %w", err)
		}
		l := latencyOf(lr.latencies)
		l.Transcripts, l.Rate = len(short), bf.latencyRate
		l.BatchMaxWaitMs = ms(cfg.BatchMaxWait)
		l.BatchScoreMs = ms(percentile(lr.scoreDurs, 0.5))
		l.BoundMs = l.BatchMaxWaitMs + 2*l.BatchScoreMs
		ok := l.P99Ms <= l.BoundMs
		l.BoundOK = &ok
		mr.LatencyLow = &l
	}

	// 6: CPU scaling (pool and tokenizer, no Kafka).
	if !skip["scaling"] {
		sevs := scalingEvents(sample, bf.scalingPairs, labels)
		progress(e, "%s: CPU scaling, threads %v × workers %v", m.Name, threads, workers)
		end := mt.begin("scaling")
		pts, err := runScaling(ctx, rt, cfg, m, sevs, threads, workers, bf.scalingRounds)
		end()
		if err != nil {
			return mr, err
		}
		mr.Scaling = pts
	}

	// 5: memory of the scorer process under a backlog.
	if !skip["memory"] {
		limit := cfg.BatchMaxMessages * cfg.MaxInflightBatches
		for _, k := range multiples {
			progress(e, "%s: memory, backlog %d× in-flight limit (%d records), scorer process for %s", m.Name, k, k*limit, bf.memDuration)
			end := mt.begin("memory")
			mp, err := runMemory(ctx, cfg, dir, corpus, k*limit, k, bf.memDuration)
			end()
			if err != nil {
				return mr, fmt.Errorf("memory: %w", err)
			}
			mr.Memory.Points = append(mr.Memory.Points, mp)
		}
		mr.Memory.InflightLimit = limit
		mr.Memory.MaxGrowth = memoryGrowthTarget.bound
		if n := len(mr.Memory.Points); n >= 2 {
			lo, hi := mr.Memory.Points[0].PeakRSSMiB, mr.Memory.Points[n-1].PeakRSSMiB
			mr.Memory.Growth = hi/lo - 1
			flat := memoryGrowthTarget.ok(mr.Memory.Growth)
			mr.Memory.Flat = &flat
		}
	}
	return mr, nil
}

// benchPerf runs the sections about doing less work per pair for one model
// folder: CPU batch shapes, the revision workload (not on the large
// stand-in: its cache behaviour is the small models'), fp32 vs int8.
func benchPerf(ctx context.Context, e cli.Env, rt *scoring.Runtime, cfg config.Config, bf benchFlags, mt *meter, dir string, corpus []corpusLine, skip map[string]bool, large bool, rows, tokens []int, plans []cpuShape) (perfReport, error) {
	cfg.ModelDir, cfg.ModelFile = dir, ""
	m, err := scoring.LoadModel(cfg)
	if err != nil {
		return perfReport{}, err
	}
	pr := perfReport{Model: m.Name}
	section := func(name string) string { return name }
	if large {
		// The stand-in is opt-in and slow: its rows follow --skip large
		// alone, so they can be run without the small models' sections.
		pr.Model += largeSuffix
		skip = map[string]bool{"revision": true}
		section = func(string) string { return "large" }
	}
	labels := len(cfg.Labels)
	sample := spreadSample(corpus, bf.limit)
	pairs := bf.shapePairs
	if large {
		pairs = bf.largePairs
	}
	if !skip["shapes"] {
		evs := scalingEvents(sample, pairs, labels)
		rounds := bf.shapeRounds
		if large {
			rounds = 1
		}
		progress(e, "%s: CPU batch shapes, rows %v × tokens %v × plans %s, %d round(s)", pr.Model, rows, tokens, bf.shapePlans, rounds)
		end := mt.begin(section("shapes"))
		pr.Shapes, err = runShapes(ctx, rt, cfg, m, evs, rows, tokens, plans, rounds)
		end()
		if err != nil {
			return pr, err
		}
	}
	if !skip["revision"] && !large {
		lines := spreadSample(corpus, bf.revisionN)
		_, _, evs := splitLines(lines)
		progress(e, "%s: revision workload, %d transcripts × %d versions, %.0f%% edited, cache off / on / capped at %d bytes", pr.Model, len(evs), bf.revisionVers, 100*bf.revisionEdit, bf.revisionCap)
		capBytes := int64(cfg.ScoreCacheBytes)
		if capBytes == 0 {
			capBytes = 256 << 20 // SCORE_CACHE_BYTES=0 turns the service's cache off, not this section
		}
		end := mt.begin("revision")
		pr.Revision, err = runRevision(ctx, rt, cfg, m, evs, bf.revisionVers, bf.revisionEdit, capBytes, bf.revisionCap, bf.revisionRnds)
		end()
		if err != nil {
			return pr, err
		}
	}
	if !skip["int8"] {
		n := bf.int8Pairs
		if large {
			n = bf.largePairs
		}
		evs := scalingEvents(sample, n, labels)
		progress(e, "%s: fp32 vs int8 (%s), %d transcripts", pr.Model, int8File, len(evs))
		rounds := bf.int8Rounds
		if large {
			rounds = 1
		}
		end := mt.begin(section("int8"))
		pr.Int8, err = runInt8(ctx, rt, cfg, dir, evs, rounds)
		end()
		if err != nil {
			return pr, err
		}
	}
	return pr, nil
}

// splitLines returns the records, their call_ids and decoded events.
func splitLines(lines []corpusLine) (recs [][]byte, keys []string, evs []schema.TranscriptEvent) {
	for _, l := range lines {
		recs = append(recs, l.raw)
		keys = append(keys, l.ev.CallID)
		evs = append(evs, l.ev)
	}
	return recs, keys, evs
}

// scalingEvents picks, from the sample sorted by size, the smallest event
// as a warm-up followed by events until at least pairs pairs.
func scalingEvents(sample []corpusLine, pairs, labels int) []schema.TranscriptEvent {
	sorted := bySize(sample)
	evs := []schema.TranscriptEvent{sorted[0].ev}
	n := 0
	for _, l := range sorted[1:] {
		if n >= pairs {
			break
		}
		evs = append(evs, l.ev)
		n += l.sentences * labels
	}
	if len(evs) == 1 { // a sample of one: time the warm-up event again
		evs = append(evs, sorted[0].ev)
	}
	return evs
}

func progress(e cli.Env, format string, args ...any) {
	fmt.Fprintf(e.Stderr, "bench: "+format+"\n", args...)
}

func intList(s string) ([]int, error) {
	var out []int
	for _, p := range config.SplitList(s, ",") {
		n, err := strconv.Atoi(p)
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("%q is not a positive integer", p)
		}
		out = append(out, n)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("empty list")
	}
	return out, nil
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// percentile is the nearest-rank q-quantile of ds (0 when empty).
func percentile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(q*float64(len(s))+0.999999) - 1
	return s[min(max(i, 0), len(s)-1)]
}

func latencyOf(ds []time.Duration) latencyResult {
	return latencyResult{Samples: len(ds), P50Ms: ms(percentile(ds, 0.50)), P95Ms: ms(percentile(ds, 0.95)), P99Ms: ms(percentile(ds, 0.99))}
}

// machineInfo describes where the numbers were taken.
func machineInfo() machine {
	mi := machine{Cores: runtime.NumCPU(), GoVersion: runtime.Version(), ORTVersion: ort.GetVersion(),
		OS: runtime.GOOS + "/" + runtime.GOARCH, Date: time.Now().UTC().Format(time.RFC3339)}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				mi.CPU = strings.TrimSpace(v)
				break
			}
		}
	}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		line, _, _ := strings.Cut(string(b), "\n")
		if f := strings.Fields(line); len(f) >= 2 {
			if kib, err := strconv.ParseFloat(f[1], 64); err == nil {
				mi.MemoryGiB = kib / (1 << 20)
			}
		}
	}
	return mi
}

// perfDir is a model folder the "less work per pair" sections run on;
// large marks --large-model, which runs its own smaller sweep.
type perfDir struct {
	dir   string
	large bool
}

// perfDirs is the small model folders, then --large-model unless the
// large section is skipped (a skipped one must not turn the last small
// folder into "the large stand-in").
func perfDirs(dirs []string, largeModel string, skip map[string]bool) []perfDir {
	out := make([]perfDir, 0, len(dirs)+1)
	for _, d := range dirs {
		out = append(out, perfDir{dir: d})
	}
	if largeModel != "" && !skip["large"] {
		out = append(out, perfDir{dir: largeModel, large: true})
	}
	return out
}
