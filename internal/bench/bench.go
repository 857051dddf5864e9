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
	"fmt"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/scorer/scorer/internal/cli"
	"github.com/scorer/scorer/internal/config"
	"github.com/scorer/scorer/internal/fanout/scorecache"
	"github.com/scorer/scorer/internal/scoring"
	"github.com/scorer/scorer/model/ortenv"
)

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

func progress(e cli.Env, format string, args ...any) {
	fmt.Fprintf(e.Stderr, "bench: "+format+"\n", args...)
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
	mi := machine{Cores: runtime.NumCPU(), GoVersion: runtime.Version(), ORTVersion: ortenv.Version(),
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
