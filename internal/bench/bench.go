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
	"github.com/scorer/scorer/model"
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
	br := &benchRun{e: e, rt: rt, cfg: cfg, bf: bf, log: log, mt: newMeter(), corpus: corpus, dirs: dirs, skip: skip,
		threads: threads, workers: workers, multiples: multiples, rows: rows, tokens: tokens, plans: plans, rep: &rep}
	if err := br.runAll(ctx); err != nil {
		return err
	}
	rep.Sections = br.mt.report()
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

// benchRun is one `scorer bench` run: what every section's run function
// reads (flags, settings, corpus, the parsed lists) and the report they
// write.
type benchRun struct {
	e         cli.Env
	rt        *scoring.Runtime
	cfg       config.Config
	bf        benchFlags
	log       zerolog.Logger
	mt        *meter
	corpus    []corpusLine
	dirs      []string
	skip      map[string]bool
	threads   []int // --scaling-threads
	workers   []int // --scaling-workers
	multiples []int // --memory-multiples
	rows      []int // --shape-rows
	tokens    []int // --shape-tokens
	plans     []cpuShape
	rep       *benchReport

	rawLoop, rawNote string // findRawLoop's answer, once asked (rawLooked)
	rawLooked        bool
}

// folder is one model folder an eachModel or eachPerf section runs on.
type folder struct {
	dir    string
	cfg    config.Config // the run's settings on this folder
	m      *model.Model
	name   string       // as the folder's rows name it
	sample []corpusLine // --transcripts-limit transcripts spread over sizes
	labels int
	prof   string // the pipeline's CPU profile ("" = none)

	mr *modelReport // eachModel sections write here
	pr *perfReport  // eachPerf sections write here

	// The --large-model stand-in (benchLarge) runs the shapes and int8
	// sections on its own, smaller sweep, timed as the large section.
	large        bool
	rows, tokens []int
}

// span is the name a section of f is timed under.
func (f *folder) span(section string) string {
	if f.large {
		return "large"
	}
	return section
}

// runAll runs the section table: each model folder's eachModel sections,
// then each folder's eachPerf sections, then the once sections, each in
// table order and less those --skip names.
func (b *benchRun) runAll(ctx context.Context) error {
	for _, d := range b.dirs {
		dir, err := config.ResolvePath(d)
		if err != nil {
			return fmt.Errorf("bench: model dir: %w", err)
		}
		f, err := b.modelFolder(dir)
		if err == nil && !b.skip["pipeline"] {
			err = b.runScope(ctx, eachModel, f)
		}
		if err != nil {
			return fmt.Errorf("bench: %s: %w", filepath.Base(dir), err)
		}
		b.rep.Models = append(b.rep.Models, *f.mr)
	}
	for _, d := range b.dirs {
		dir, err := config.ResolvePath(d)
		if err != nil {
			return fmt.Errorf("bench: model dir: %w", err)
		}
		f, err := b.perfFolder(dir, false, b.rows, b.tokens)
		if err == nil {
			err = b.runScope(ctx, eachPerf, f)
		}
		if err != nil {
			return fmt.Errorf("bench: %s: %w", filepath.Base(dir), err)
		}
		b.rep.Perf = append(b.rep.Perf, *f.pr)
	}
	return b.runScope(ctx, once, nil)
}

// runScope runs, in table order, the sections of scope not skipped.
func (b *benchRun) runScope(ctx context.Context, scope sectionScope, f *folder) error {
	for _, s := range sections {
		if s.scope == scope && !b.skip[s.name] {
			if err := s.run(ctx, b, f); err != nil {
				return err
			}
		}
	}
	return nil
}

// modelFolder loads dir for the eachModel sections.
func (b *benchRun) modelFolder(dir string) (*folder, error) {
	cfg := b.cfg
	cfg.ModelDir = dir
	m, err := scoring.LoadModel(cfg)
	if err != nil {
		return nil, err
	}
	f := &folder{dir: dir, cfg: cfg, m: m, name: m.Name, sample: spreadSample(b.corpus, b.bf.limit), labels: len(cfg.Labels),
		mr: &modelReport{Model: m.Name, SHA256: m.SHA256}}
	if b.bf.cpuProfile != "" {
		f.prof = b.bf.cpuProfile
		if len(b.dirs) > 1 {
			ext := filepath.Ext(f.prof)
			f.prof = strings.TrimSuffix(f.prof, ext) + "-" + m.Name + ext
		}
		f.mr.CPUProfile = f.prof
	}
	return f, nil
}

// perfFolder loads dir for the eachPerf sections (or, large, for the
// stand-in's), with the shape sweep's rows and tokens.
func (b *benchRun) perfFolder(dir string, large bool, rows, tokens []int) (*folder, error) {
	cfg := b.cfg
	cfg.ModelDir, cfg.ModelFile = dir, ""
	m, err := scoring.LoadModel(cfg)
	if err != nil {
		return nil, err
	}
	f := &folder{dir: dir, cfg: cfg, m: m, name: m.Name, sample: spreadSample(b.corpus, b.bf.limit), labels: len(cfg.Labels),
		large: large, rows: rows, tokens: tokens}
	if large {
		f.name += largeSuffix
	}
	f.pr = &perfReport{Model: f.name}
	return f, nil
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
