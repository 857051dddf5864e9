package bench

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"text/tabwriter"

	"github.com/scorer/scorer/internal/cli"
	"github.com/scorer/scorer/internal/config"
	"github.com/scorer/scorer/internal/scoring"
	"github.com/scorer/scorer/model"
)

// productionCheck is one of issue 25's (or 32's) targets on the production-size
// stand-in, as measured.
type productionCheck struct {
	Name   string  `json:"name"`
	Value  float64 `json:"value"`
	Target string  `json:"target"`
	OK     bool    `json:"ok"`
}

// benchWholeProcess runs the whole-process comparison on the small model
// folders (typical input) and on --production-model (fp32 and int8, typical
// and long inputs, start-up), and derives the production checks.
func benchWholeProcess(ctx context.Context, e cli.Env, cfg config.Config, bf benchFlags, mt *meter, corpus []corpusLine, dirs []string, skip map[string]bool, rep *benchReport) error {
	small := !skip["wholeproc"]
	prod := bf.prodModel != "" && !skip["production"]
	if !small && !prod {
		return nil
	}
	rawLoop, rawNote := findRawLoop()
	if rawNote != "" {
		progress(e, "whole process: no raw loop (%s); scorer score rows only", rawNote)
	}
	work, err := os.MkdirTemp("", "scorer-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	one := filepath.Join(work, "one.jsonl")
	if err := os.WriteFile(one, []byte(`{"call_id":"BENCH-ONE","sections":{"FILT_MD":["Revenue grew in the quarter."]}}`+"\n"), 0o644); err != nil {
		return err
	}
	type job struct {
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
	var jobs []job
	if small {
		for _, d := range dirs {
			jobs = append(jobs, job{dir: d, inputs: []string{"typical"}, rounds: bf.wholeRounds, sents: bf.wholeSentences, long: 1, section: "wholeproc"})
		}
	}
	if prod {
		jobs = append(jobs, job{dir: bf.prodModel, graphs: []string{"model.onnx", int8File}, inputs: []string{"typical", "long"},
			rounds: bf.prodRounds, sents: bf.prodSentences, long: bf.prodLong, startup: true, section: "production"})
		jobs = append(jobs, job{dir: bf.prodModel, graphs: []string{"model.onnx", int8File}, startup: true, section: "production", external: true})
	}
	prodName := ""
	for i, j := range jobs {
		dir, err := config.ResolvePath(j.dir)
		if err != nil {
			return fmt.Errorf("bench: model dir: %w", err)
		}
		if j.external {
			if dir, err = externalCopy(dir, j.graphs, filepath.Join(work, fmt.Sprint(i, "-external"))); err != nil {
				return fmt.Errorf("bench: %w", err)
			}
		}
		c := cfg
		c.ModelDir, c.ModelFile = dir, ""
		m, err := scoring.LoadModel(c)
		if err != nil {
			return err
		}
		graphs := j.graphs
		if graphs == nil {
			rel, err := filepath.Rel(dir, m.ONNXPath)
			if err != nil {
				return err
			}
			graphs = []string{rel}
		}
		wd := filepath.Join(work, fmt.Sprint(i))
		if err := os.MkdirAll(wd, 0o755); err != nil {
			return err
		}
		var typical, long string
		if len(j.inputs) > 0 {
			if typical, long, err = wholeProcInputs(wd, m, corpus, j.sents, j.long); err != nil {
				return err
			}
		}
		for _, g := range graphs {
			if _, err := os.Stat(filepath.Join(dir, g)); err != nil {
				progress(e, "%s: no %s, skipped", filepath.Base(dir), g)
				continue
			}
			end := mt.begin(j.section)
			rows, sp, err := runWholeProcess(ctx, e, wholeProcOpts{
				dir: dir, graph: g, inputs: j.inputs, files: map[string]string{"typical": typical, "long": long},
				rounds: j.rounds, rawLoop: rawLoop, rawNote: rawNote, startup: j.startup, startupInput: one,
				workDir: wd, cfg: c, m: m, rewriteAB: j.section == "production",
			})
			end()
			if err != nil {
				return fmt.Errorf("bench: whole process, %s %s: %w", filepath.Base(dir), g, err)
			}
			if sp != nil {
				rep.Startup = append(rep.Startup, *sp)
				for i := range rows {
					// The rows ran with the calibration kept.
					if net := rows[i].ScorerSeconds - sp.CachedSeconds; net > 0 {
						rows[i].ScorerNetPairsPerSec = float64(rows[i].Pairs) / net
					}
				}
			}
			rep.WholeProcess = append(rep.WholeProcess, rows...)
		}
		if j.section == "production" && !j.external {
			prodName = filepath.Base(dir)
		}
	}
	if prodName != "" {
		rep.Production = productionChecks(prodName, rep.WholeProcess, rep.Startup)
	}
	return nil
}

// externalCopy makes a model folder under parent, named after src with
// "-external", holding links to src's files and each of graphs re-saved
// with its weights in an external data file beside it.
func externalCopy(src string, graphs []string, parent string) (string, error) {
	dir := filepath.Join(parent, filepath.Base(src)+"-external")
	entries, err := os.ReadDir(src)
	if err != nil {
		return "", err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	for _, e := range entries {
		if !e.IsDir() && !slices.Contains(graphs, e.Name()) {
			if err := os.Symlink(filepath.Join(src, e.Name()), filepath.Join(dir, e.Name())); err != nil {
				return "", err
			}
		}
	}
	for _, g := range graphs {
		if _, err := os.Stat(filepath.Join(src, g)); err != nil {
			continue // the caller reports a missing graph
		}
		if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, g)), 0o755); err != nil {
			return "", err
		}
		if err := model.WriteExternalData(filepath.Join(src, g), filepath.Join(dir, g)); err != nil {
			return "", err
		}
	}
	return dir, nil
}

// productionChecks derives the production-size targets from the rows of
// model (issue 25): long inputs' peak RSS within 1.25× of typical ones',
// int8 below fp32 in memory and at least 2× its pairs/s, and `scorer score`
// at least 0.95× the raw loop's pairs/s at no more than 1.25× its peak RSS.
// The rows ran with the CPU memory calibration kept from an earlier start;
// the first start on a machine measures it, and its ratio (the row's wall
// time plus the start-ups' difference) is listed too.
func productionChecks(model string, rows []wholeProcess, startups []startupPoint) []productionCheck {
	get := func(graph, input string) *wholeProcess {
		for i := range rows {
			if r := &rows[i]; r.Model == model && r.Graph == graph && r.Input == input {
				return r
			}
		}
		return nil
	}
	var out []productionCheck
	add := func(name string, t target, v float64) {
		out = append(out, productionCheck{Name: name, Value: v, Target: t.String(), OK: t.ok(v)})
	}
	for _, g := range []string{"model.onnx", int8File} {
		if t, l := get(g, "typical"), get(g, "long"); t != nil && l != nil {
			v := l.ScorerPeakRSSMiB / t.ScorerPeakRSSMiB
			add(g+": peak RSS long / typical", atMost(1.25, ""), v)
		}
	}
	for _, in := range []string{"typical", "long"} {
		if f, q := get("model.onnx", in), get(int8File, in); f != nil && q != nil {
			v := q.ScorerPeakRSSMiB / f.ScorerPeakRSSMiB
			add("int8 / fp32 peak RSS, "+in, below(1, ""), v)
			s := q.ScorerNetPairsPerSec / f.ScorerNetPairsPerSec
			add("int8 / fp32 pairs/s after start-up, "+in, atLeast(2, ""), s)
			if q.ScorerCPUSeconds > 0 {
				c := f.ScorerCPUSeconds / q.ScorerCPUSeconds
				add("int8 / fp32 pairs per CPU-second, "+in, atLeast(2, ""), c)
			}
		}
	}
	for _, g := range []string{"model.onnx", int8File} {
		for _, in := range []string{"typical", "long"} {
			if r := get(g, in); r != nil && r.RawSeconds > 0 {
				add(fmt.Sprintf("%s %s: scorer / raw loop pairs/s", g, in), atLeast(0.95, ""), r.SpeedRatio)
				for _, sp := range startups {
					if sp.Model == model && sp.Graph == g && sp.CachedSeconds > 0 {
						first := r.RawSeconds / (r.ScorerSeconds + sp.Seconds - sp.CachedSeconds)
						add(fmt.Sprintf("%s %s: scorer / raw loop pairs/s, first start (calibration measured)", g, in), atLeast(0.95, ""), first)
					}
				}
				add(fmt.Sprintf("%s %s: scorer / raw loop pairs per CPU-second", g, in), atLeast(0.95, ""), r.CPURatio)
				add(fmt.Sprintf("%s %s: scorer / raw loop peak RSS", g, in), atMost(1.25, ""), r.RSSRatio)
			}
		}
	}
	for _, sp := range startups {
		if sp.Model == model+"-external" {
			for _, in := range startups {
				if in.Model == model && in.Graph == sp.Graph && in.CachedSeconds > 0 {
					v := sp.CachedPeakRSSMiB / in.CachedPeakRSSMiB
					add(sp.Graph+": start-up peak RSS, external data / inline", atMost(1.05, ""), v)
				}
			}
		}
	}
	for g, limit := range map[string]float64{"model.onnx": leanPeakFP32, int8File: leanPeakInt8} {
		for _, in := range []string{"typical", "long"} {
			if r := get(g, in); r != nil {
				v := r.ScorerPeakRSSMiB * (1 << 20) / 1e9
				add(fmt.Sprintf("%s %s: scorer peak RSS, GB", g, in), atMost(limit, "").digits(1), v)
			}
		}
	}
	return append(out, rewriteChecks(get)...)
}

// leanPeakFP32 and leanPeakInt8 are issue 35's bounds on `scorer score`'s
// peak RSS on the production stand-in, in GB: the weights held once, mapped
// from the model's files, not beside the protobuf they were parsed from.
const (
	leanPeakFP32 = 1.6
	leanPeakInt8 = 1.0
)

// rewriteTargets are issue 32's whole-process targets for the scorer with
// the relative-attention rewrite against the raw loop on the graph as
// exported, by input: typical sentences, where the rewrite drops the
// relative positions no pair uses, and ~500-token ones, where the issue
// expected the [rows·heads, L, L] int64 indices to dominate (on the CPU
// they are ~3.5% of a batch: docs/benchmarks.md).
var rewriteTargets = map[string]float64{"typical": 1.1, "long": 1.4}

// rewriteChecks derives issue 32's targets from the rows that ran the
// rewrite A/B (wholeProcess.UnrewrittenSeconds): for fp32 and for int8
// (whose own gain must stack on the rewrite's, so it is held to the same
// lead over its raw loop), the scorer's pairs/s against the raw loop and
// its peak RSS against the unrewritten scorer's, no higher.
func rewriteChecks(get func(graph, input string) *wholeProcess) []productionCheck {
	var out []productionCheck
	for _, g := range []string{"model.onnx", int8File} {
		for _, in := range []string{"typical", "long"} {
			r := get(g, in)
			if r == nil || r.RewriteSpeedup == 0 {
				continue
			}
			if r.RawSeconds > 0 {
				t := atLeast(rewriteTargets[in], "").digits(1)
				out = append(out, productionCheck{Name: fmt.Sprintf("%s %s: scorer (rewrite) / raw loop (graph as exported) pairs/s", g, in),
					Value: r.SpeedRatio, Target: t.String(), OK: t.ok(r.SpeedRatio)})
			}
			t := atMost(1, "")
			out = append(out, productionCheck{Name: fmt.Sprintf("%s %s: scorer peak RSS, rewrite / as exported", g, in),
				Value: r.RewriteRSSRatio, Target: t.String(), OK: t.ok(r.RewriteRSSRatio)})
		}
	}
	return out
}

// printWholeTable writes the whole-process rows of the sections want
// accepts: wholeproc (the small models) and production (the
// --production-model rows, their start-up and checks).
func printWholeTable(w io.Writer, r *benchReport, want func(section string) bool) {
	var rows []wholeProcess
	for _, x := range r.WholeProcess {
		if want(wholeSection(r, x.Model)) {
			rows = append(rows, x)
		}
	}
	if len(rows) == 0 {
		return
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "whole process\tpairs (mean/max tokens)\tscorer pairs/s (after start-up)\tscorer peak RSS MiB\traw loop pairs/s\traw peak RSS MiB\tscorer/raw speed\tper CPU-s\tscorer/raw RSS\trounds")
	for _, x := range rows {
		raw, rawRSS, sp, cpu, rss := "-", "-", "-", "-", "-"
		if x.RawSeconds > 0 {
			raw, rawRSS = fmt.Sprintf("%.2f", x.RawPairsPerSec), fmt.Sprintf("%.0f", x.RawPeakRSSMiB)
			target := 1.0 // the small models' target
			if isProduction(r, x.Model) {
				target = 0.95
			}
			sp = fmt.Sprintf("%.3f %s", x.SpeedRatio, mark(x.SpeedRatio >= target))
			rss = fmt.Sprintf("%.2f", x.RSSRatio)
			cpu = fmt.Sprintf("%.3f", x.CPURatio)
		}
		net := ""
		if x.ScorerNetPairsPerSec > 0 {
			net = fmt.Sprintf(" (%.2f)", x.ScorerNetPairsPerSec)
		}
		fmt.Fprintf(tw, "%s %s %s\t%d (%.0f/%d)\t%.2f%s\t%.0f\t%s\t%s\t%s\t%s\t%s\t%d\n", x.Model, x.Graph, x.Input, x.Pairs,
			x.MeanPairTokens, x.MaxPairTokens, x.ScorerPairsPerSec, net, x.ScorerPeakRSSMiB, raw, rawRSS, sp, cpu, rss, x.Rounds)
	}
	if want("production") {
		for _, s := range r.Startup {
			fmt.Fprintf(tw, "start-up %s %s (scorer score, one sentence)\t%.1f s, peak RSS %.0f MiB; calibration kept: %.1f s, %.0f MiB\n",
				s.Model, s.Graph, s.Seconds, s.PeakRSSMiB, s.CachedSeconds, s.CachedPeakRSSMiB)
		}
		for _, x := range rows {
			if x.RewriteSpeedup > 0 {
				fmt.Fprintf(tw, "REL_ATTENTION_REWRITE=false %s %s %s\t%.2f pairs/s, peak RSS %.0f MiB; the rewrite: %.3f× the pairs/s, %.3f× the peak RSS\n",
					x.Model, x.Graph, x.Input, float64(x.Pairs)/x.UnrewrittenSeconds, x.UnrewrittenPeakRSSMiB, x.RewriteSpeedup, x.RewriteRSSRatio)
			}
		}
		for _, c := range r.Production {
			fmt.Fprintf(tw, "check: %s\t%.3f\t%s %s\n", c.Name, c.Value, c.Target, mark(c.OK))
		}
	}
	tw.Flush()
}

// wholeSection is the section a whole-process row of model belongs to.
func wholeSection(r *benchReport, model string) string {
	if isProduction(r, model) {
		return "production"
	}
	return "wholeproc"
}

// isProduction reports whether model's rows are the production checks'.
func isProduction(r *benchReport, model string) bool {
	for _, s := range r.Startup {
		if s.Model == model {
			return true
		}
	}
	return false
}
