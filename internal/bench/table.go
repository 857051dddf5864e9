package bench

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/scorer/scorer/internal/cli"
	"github.com/scorer/scorer/internal/config"
)

// section is one part of `scorer bench`: the word --skip takes, the key of
// the JSON report's "sections" and the name of its block in the --md file;
// what it measures, how it runs and which rows it writes (docs/design.md
// shows this table); the table its rows belong to; whether a report holds
// its figures; and how benchRun.runAll runs it: its scope and its run
// function, which lives in the section's own file, section_NAME.go.
type section struct {
	name     string
	measures string
	runs     string
	rows     string
	table    sectionTable
	has      func(*benchReport) bool
	scope    sectionScope
	run      func(ctx context.Context, b *benchRun, f *folder) error
}

// sectionScope is what a section runs on, so which loop of the driver
// calls its run function. The table lists the scopes in the order below.
type sectionScope int

const (
	// eachModel: once per --model-dirs folder, writing its modelReport
	// (f.mr). --skip pipeline skips the folder's other eachModel sections
	// too, as it always has.
	eachModel sectionScope = iota
	// eachPerf: once per --model-dirs folder, writing its perfReport (f.pr).
	eachPerf
	// once: once per run, writing the report (f is nil).
	once
)

// sectionTable is the printed table a section's rows belong to; a block
// of the --md file holds that table's rows of the one section.
type sectionTable int

const (
	modelTable sectionTable = iota // printTable: a column per small model
	perfTable                      // printPerfTable over the small models
	largeTable                     // printPerfTable over the --large-model stand-in
	wholeTable                     // printWholeTable: a row per process run
)

// sections are the parts of `scorer bench`, in the order they run (each
// folder's eachModel sections, then each folder's eachPerf ones, then the
// once ones) and the order of their blocks in the --md file. Each has its
// own block, so a run of some sections replaces only theirs and every
// block keeps the conditions of the run that wrote it. Adding a section is
// a row here and a file, section_NAME.go, holding its run function and
// what serves only it.
var sections = []section{
	{name: "pipeline", measures: "pipeline vs raw ORT, padding, tokenizer, latency at saturation",
		runs:  "in process: what `scorer run` runs (streaming.Prepare, scoring.Open, producer, consumer) against a child `scorer broker`, then its batches replayed on raw ORT",
		rows:  "throughput sample, raw ORT, pipeline (inferred and served pairs/s), ratios, engine busy, wall split, padding, tokenizer, latency at saturation",
		table: modelTable, scope: eachModel, run: benchPipeline,
		has: ranPipeline},
	{name: "latency", measures: "latency at a low rate",
		runs:  "in process: the pipeline again, the shortest transcripts at --latency-rate",
		rows:  "low-rate p50/p95/p99 against BATCH_MAX_WAIT + 2 × a batch's score time",
		table: modelTable, scope: eachModel, run: benchLatency,
		has: ranLatency},
	{name: "memory", measures: "scorer peak RSS under a backlog",
		runs:  "child processes: `scorer run` against a child broker holding 20× and 60× the in-flight limit",
		rows:  "peak RSS per backlog, growth",
		table: modelTable, scope: eachModel, run: benchMemory,
		has: func(r *benchReport) bool {
			return slices.ContainsFunc(r.Models, func(m modelReport) bool { return len(m.Memory.Points) > 0 })
		}},
	{name: "scaling", measures: "CPU scaling, threads × workers",
		runs:  "in process: CPU stacks (scoring.Open, no cache) at threads × workers, interleaved rounds",
		rows:  "pairs/s per threads × workers",
		table: modelTable, scope: eachModel, run: benchScaling,
		has: func(r *benchReport) bool {
			return slices.ContainsFunc(r.Models, func(m modelReport) bool { return len(m.Scaling) > 0 })
		}},
	{name: "shapes", measures: "CPU batch shapes",
		runs:  "in process: CPU stacks at every rows × tokens × plan, interleaved rounds",
		rows:  "pairs/s and pairs per CPU-second per shape",
		table: perfTable, scope: eachPerf, run: benchShapes,
		has: func(r *benchReport) bool {
			return slices.ContainsFunc(smallPerf(r), func(p perfReport) bool { return len(p.Shapes) > 0 })
		}},
	{name: "revision", measures: "revision workload with the score cache",
		runs:  "in process: CPU stacks with the cache off, on and capped (WithCache)",
		rows:  "pairs inferred, pairs/s and per CPU-second, cache off / on, capped cache's bytes and RSS",
		table: perfTable, scope: eachPerf, run: benchRevision,
		has: func(r *benchReport) bool {
			return slices.ContainsFunc(smallPerf(r), func(p perfReport) bool { return p.Revision != nil })
		}},
	{name: "int8", measures: "fp32 vs int8",
		runs:  "in process: CPU stacks on model.onnx and onnx/model_quantized.onnx, alternating rounds",
		rows:  "pairs/s each, max and p99 of the difference in scores, decisions agreeing",
		table: perfTable, scope: eachPerf, run: benchInt8,
		has: func(r *benchReport) bool {
			return slices.ContainsFunc(smallPerf(r), func(p perfReport) bool { return p.Int8 != nil })
		}},
	{name: "large", measures: "the --large-model stand-in: batch shapes and fp32 vs int8",
		runs:  "in process: the shapes and int8 sections on --large-model, one round",
		rows:  "the shapes and int8 rows of the stand-in",
		table: largeTable, scope: once, run: benchLarge,
		has: func(r *benchReport) bool { return len(largePerf(r)) > 0 }},
	{name: "wholeproc", measures: "whole process against the raw loop, small models",
		runs:  "child processes: `scorer score` and tools/rawloop on the same file, alternating rounds",
		rows:  "wall, CPU, pairs/s and peak RSS of each, scorer / loop",
		table: wholeTable, scope: once, run: benchWholeproc,
		has: func(r *benchReport) bool { return hasWhole(r, "wholeproc") }},
	{name: "production", measures: "whole process against the raw loop, --production-model",
		runs:  "child processes: as wholeproc on the production stand-in's fp32 and int8 graphs, typical and long inputs, start-up",
		rows:  "as wholeproc, plus start-up (scorer and raw loop) and issue 25's, 35's and 45's checks",
		table: wholeTable, scope: once, run: benchProduction,
		has: func(r *benchReport) bool { return hasWhole(r, "production") }},
}

// sectionNamed is the section called name (nil when none is).
func sectionNamed(name string) *section {
	for i := range sections {
		if sections[i].name == name {
			return &sections[i]
		}
	}
	return nil
}

// hasWhole reports whether r has whole-process rows of section.
func hasWhole(r *benchReport, section string) bool {
	return slices.ContainsFunc(r.WholeProcess, func(x wholeProcess) bool { return wholeSection(r, x.Model) == section })
}

// print writes s's rows of r: its table, less the rows of other sections.
func (s *section) print(w io.Writer, r *benchReport) {
	only := func(name string) bool { return name == s.name }
	switch s.table {
	case modelTable:
		printTable(w, r, only)
	case perfTable:
		printPerfTable(w, smallPerf(r), only)
	case largeTable:
		printPerfTable(w, largePerf(r), func(name string) bool { return name == "shapes" || name == "int8" })
	case wholeTable:
		printWholeTable(w, r, only)
	}
}

// sectionsMarkdown is the section table as docs/design.md shows it, one
// row per section (TestSectionTableInDesign keeps the two equal).
func sectionsMarkdown() string {
	var b strings.Builder
	b.WriteString("| section (`--skip`, `--md` block) | measures | runs | rows |\n|---|---|---|---|\n")
	for _, s := range sections {
		fmt.Fprintf(&b, "| `%s` | %s | %s | %s |\n", s.name, s.measures, s.runs, s.rows)
	}
	return b.String()
}

// skipSet reads --skip: the sections it names, each a row of the table. A
// name that is none is a usage error (a typo would otherwise run the
// section it meant to skip, which can take half an hour).
func skipSet(list string) (map[string]bool, error) {
	skip := map[string]bool{}
	for _, name := range config.SplitList(list, ",") {
		if sectionNamed(name) == nil {
			names := make([]string, len(sections))
			for i, s := range sections {
				names[i] = s.name
			}
			return nil, cli.UsageError{Msg: fmt.Sprintf("bench: --skip %q: no such section (sections: %s)", name, strings.Join(names, ", "))}
		}
		skip[name] = true
	}
	return skip, nil
}
