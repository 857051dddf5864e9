package bench

import (
	"flag"
	"fmt"
	"strconv"
	"time"

	"github.com/scorer/scorer/internal/cli"
	"github.com/scorer/scorer/internal/config"
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
