package bench

import (
	"fmt"
	"io"
	"text/tabwriter"
)

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
			fmt.Fprintf(tw, "start-up %s %s (scorer score, one sentence)\t%.1f s, peak RSS %.0f MiB; calibration and graph cache kept: %.1f s, %.0f MiB\n",
				s.Model, s.Graph, s.Seconds, s.PeakRSSMiB, s.CachedSeconds, s.CachedPeakRSSMiB)
			if s.RawSeconds > 0 {
				fmt.Fprintf(tw, "start-up %s %s (raw loop, one sentence)\t%.1f s, peak RSS %.0f MiB\n",
					s.Model, s.Graph, s.RawSeconds, s.RawPeakRSSMiB)
			}
			if s.GraphCacheSeconds > 0 {
				fmt.Fprintf(tw, "start-up %s %s (scorer score writing GRAPH_CACHE; scorer run to /readyz after it)\t%.1f s; %.1f s\n",
					s.Model, s.Graph, s.GraphCacheSeconds, s.ReadySeconds)
			}
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
