package bench

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/scorer/scorer/internal/config"
)

// benchReport is docs/benchmarks.json: where and how the numbers were
// taken, and one entry per model.
type benchReport struct {
	Machine  machine       `json:"machine"`
	Settings benchSettings `json:"settings"`
	// Sections says, per section that ran, when and under what load.
	Sections map[string]sectionRun `json:"sections,omitempty"`
	Models   []modelReport         `json:"models"`
	Perf     []perfReport          `json:"perf,omitempty"`
	// WholeProcess is `scorer score` against the raw loop, whole processes,
	// on the small models and the production-size stand-in; Startup and
	// Production are the stand-in's start-up and target checks.
	WholeProcess []wholeProcess    `json:"whole_process,omitempty"`
	Startup      []startupPoint    `json:"startup,omitempty"`
	Production   []productionCheck `json:"production_checks,omitempty"`
}

type machine struct {
	CPU        string  `json:"cpu"`
	Cores      int     `json:"cores"`
	MemoryGiB  float64 `json:"memory_gib"`
	OS         string  `json:"os"`
	GoVersion  string  `json:"go_version"`
	ORTVersion string  `json:"ort_version"`
	Date       string  `json:"date"`
}

// benchSettings are the configuration values the numbers depend on.
type benchSettings struct {
	CorpusTranscripts  int     `json:"corpus_transcripts"`
	Device             string  `json:"device"`
	CPUThreads         int     `json:"cpu_threads"`
	Workers            int     `json:"workers"`
	MaxBatchTokens     int     `json:"max_batch_tokens"`
	MaxBatchRows       int     `json:"max_batch_rows"`
	CPUMaxBatchTokens  int     `json:"cpu_max_batch_tokens"`
	CPUMaxBatchRows    int     `json:"cpu_max_batch_rows"`
	BatchMaxMessages   int     `json:"batch_max_messages"`
	BatchMaxWaitMs     float64 `json:"batch_max_wait_ms"`
	MaxInflightBatches int     `json:"max_inflight_batches"`
	Labels             int     `json:"labels"`
	TranscriptsLimit   int     `json:"transcripts_limit"`
	LatencyTranscripts int     `json:"latency_transcripts"`
	LatencyRate        float64 `json:"latency_rate"`
	MemoryDurationSec  float64 `json:"memory_duration_sec"`
}

func benchSettingsOf(cfg config.Config, bf benchFlags, corpus int) benchSettings {
	return benchSettings{CorpusTranscripts: corpus, Device: cfg.Device, CPUThreads: cfg.CPUThreads, Workers: cfg.Workers,
		MaxBatchTokens: cfg.MaxBatchTokens, MaxBatchRows: cfg.MaxBatchRows, BatchMaxMessages: cfg.BatchMaxMessages,
		CPUMaxBatchTokens: cfg.CPUMaxBatchTokens, CPUMaxBatchRows: cfg.CPUMaxBatchRows,
		BatchMaxWaitMs: ms(cfg.BatchMaxWait), MaxInflightBatches: cfg.MaxInflightBatches, Labels: len(cfg.Labels),
		TranscriptsLimit: bf.limit, LatencyTranscripts: bf.latencyN, LatencyRate: bf.latencyRate, MemoryDurationSec: bf.memDuration.Seconds()}
}

type modelReport struct {
	Model             string           `json:"model"`
	SHA256            string           `json:"sha256"`
	CPUProfile        string           `json:"cpu_profile,omitempty"`
	Throughput        throughputResult `json:"throughput"`
	Padding           paddingResult    `json:"padding"`
	Tokenizer         tokenizerShare   `json:"tokenizer"`
	LatencyLow        *latencyResult   `json:"latency_low_rate,omitempty"`
	LatencySaturation latencyResult    `json:"latency_saturation"`
	Memory            memoryResult     `json:"memory"`
	Scaling           []scalingPoint   `json:"cpu_scaling,omitempty"`
}

type throughputResult struct {
	Device      string `json:"device"`
	Transcripts int    `json:"transcripts"`
	// Pairs is what the engine scored (the pool's pairs, the ratio's and
	// the raw replay's); SamplePairs every pair of the sample. With the
	// service's score cache (SCORE_CACHE_BYTES) the engine scores only the
	// misses, each distinct pair of a call once: SamplePairs − Pairs were
	// answered without it, CacheHits of them from earlier calls' scores, the
	// rest repeats within a call.
	Pairs               int     `json:"pairs"`
	SamplePairs         int     `json:"sample_pairs,omitempty"`
	CacheHits           int64   `json:"cache_hits"`
	Batches             int     `json:"inference_batches"`
	PipelineSeconds     float64 `json:"pipeline_seconds"`
	RawSeconds          float64 `json:"raw_seconds"`
	PipelinePairsPerSec float64 `json:"pipeline_pairs_per_sec"`
	// ServedPairsPerSec is SamplePairs over the pipeline's wall time: pairs
	// answered, by the engine or the cache.
	ServedPairsPerSec float64 `json:"pipeline_served_pairs_per_sec,omitempty"`
	RawPairsPerSec    float64 `json:"raw_pairs_per_sec"`
	// EngineBusyShare is the pipeline's summed engine time over its wall
	// time: how busy the device was (above 1 with several workers).
	EngineBusyShare float64 `json:"engine_busy_share"`
	// GPUBusy is NVML's utilization over the pipeline's pool (the share of
	// time a GPU ran a kernel, gpupool.GPUBusy); absent on the CPU.
	GPUBusy *float64 `json:"gpu_busy_ratio,omitempty"`
	// PipelineCPUSeconds and RawCPUSeconds are process CPU time (all
	// threads) over each run; CPURatio compares pairs per CPU-second, which
	// other tenants of a shared machine disturb much less than wall time.
	PipelineCPUSeconds float64 `json:"pipeline_cpu_seconds"`
	RawCPUSeconds      float64 `json:"raw_cpu_seconds"`
	CPURatio           float64 `json:"cpu_ratio"`
	// Split says where the pipeline's wall time went.
	Split  timeSplit `json:"time_split"`
	Ratio  float64   `json:"ratio"`
	Target float64   `json:"target"`
	OK     bool      `json:"ok"`
}

type paddingResult struct {
	Ours                float64 `json:"ours"`
	ArrivalOrder        float64 `json:"arrival_order"`
	RealTokens          uint64  `json:"real_tokens"`
	PaddedTokens        uint64  `json:"padded_tokens"`
	ArrivalPaddedTokens uint64  `json:"arrival_padded_tokens"`
	Target              float64 `json:"target"`
	OK                  bool    `json:"ok"`
}

type tokenizerShare struct {
	tokenizerResult
	PipelineCPUSeconds float64 `json:"pipeline_cpu_seconds"`
	Share              float64 `json:"share_of_pipeline_cpu"`
	Target             float64 `json:"target"`
	OK                 bool    `json:"ok"`
}

type latencyResult struct {
	Transcripts    int     `json:"transcripts"`
	Rate           float64 `json:"rate_per_sec,omitempty"`
	Samples        int     `json:"samples"`
	P50Ms          float64 `json:"p50_ms"`
	P95Ms          float64 `json:"p95_ms"`
	P99Ms          float64 `json:"p99_ms"`
	BatchMaxWaitMs float64 `json:"batch_max_wait_ms,omitempty"`
	BatchScoreMs   float64 `json:"batch_score_ms,omitempty"`
	BoundMs        float64 `json:"bound_ms,omitempty"`
	BoundOK        *bool   `json:"bound_ok,omitempty"`
}

type memoryResult struct {
	InflightLimit int           `json:"inflight_limit_records"`
	Points        []memoryPoint `json:"points,omitempty"`
	Growth        float64       `json:"growth"`
	MaxGrowth     float64       `json:"max_growth"`
	Flat          *bool         `json:"flat,omitempty"`
}

// printMachine writes where and with which settings the numbers were taken
// (the terminal's header; the Markdown blocks carry their own, per section).
func printMachine(w io.Writer, r *benchReport) {
	m := r.Machine
	fmt.Fprintf(w, "\n%s, %d cores, %.0f GiB, %s, Go %s, ONNX Runtime %s, %s\n", m.CPU, m.Cores, m.MemoryGiB, m.OS,
		strings.TrimPrefix(m.GoVersion, "go"), m.ORTVersion, m.Date)
	fmt.Fprintf(w, "%s\n", settingsLine(r.Settings))
}

// settingsLine is the configuration the numbers depend on, as variables.
func settingsLine(s benchSettings) string {
	return fmt.Sprintf("DEVICE=%s CPU_THREADS=%d WORKERS=%d MAX_BATCH_TOKENS=%d MAX_BATCH_ROWS=%d CPU_MAX_BATCH_TOKENS=%d CPU_MAX_BATCH_ROWS=%d BATCH_MAX_MESSAGES=%d BATCH_MAX_WAIT=%gms MAX_INFLIGHT_BATCHES=%d labels=%d",
		s.Device, s.CPUThreads, s.Workers, s.MaxBatchTokens, s.MaxBatchRows, s.CPUMaxBatchTokens, s.CPUMaxBatchRows, s.BatchMaxMessages, s.BatchMaxWaitMs, s.MaxInflightBatches, s.Labels)
}

// printTable writes the per-model table: a row per metric, a column per
// model, with the rows of the sections want accepts (pipeline, latency,
// memory, scaling) that have data.
func printTable(w io.Writer, r *benchReport, want func(section string) bool) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	head := "metric"
	for _, mr := range r.Models {
		head += "\t" + mr.Model
	}
	fmt.Fprintln(tw, head+"\ttarget")
	row := func(name, target string, f func(mr *modelReport) string) {
		line := name
		for i := range r.Models {
			line += "\t" + f(&r.Models[i])
		}
		fmt.Fprintln(tw, line+"\t"+target)
	}
	if want("pipeline") && ranPipeline(r) {
		row("throughput sample (transcripts / pairs / batches)", "", func(mr *modelReport) string {
			t := mr.Throughput
			return fmt.Sprintf("%d / %d / %d", t.Transcripts, t.Pairs, t.Batches)
		})
		row("raw ORT, same batches (pairs/s)", "", func(mr *modelReport) string { return f1(mr.Throughput.RawPairsPerSec) })
		row("pipeline Kafka→Kafka (pairs/s)", "", func(mr *modelReport) string { return f1(mr.Throughput.PipelinePairsPerSec) })
		if servedRows(r) {
			row("pipeline Kafka→Kafka, pairs served (pairs/s; not inferred)", "", func(mr *modelReport) string {
				t := mr.Throughput
				return fmt.Sprintf("%s; %d", f1(t.ServedPairsPerSec), t.SamplePairs-t.Pairs)
			})
		}
		row("pipeline / raw", pipelineRatioTarget.String(), func(mr *modelReport) string { return ratio(mr.Throughput.Ratio, mr.Throughput.OK) })
		row("pipeline / raw, pairs per CPU-second", "", func(mr *modelReport) string { return fmt.Sprintf("%.3f", mr.Throughput.CPURatio) })
		row("engine busy: worker-seconds / wall seconds", "", func(mr *modelReport) string { return fmt.Sprintf("%.3f", mr.Throughput.EngineBusyShare) })
		if slices.ContainsFunc(r.Models, func(m modelReport) bool { return m.Throughput.GPUBusy != nil }) {
			// Only a GPU run has the row; a CPU model in the same report reads "n/a", not 0.
			row("GPU busy (NVML utilization over the pipeline)", "", func(mr *modelReport) string {
				if mr.Throughput.GPUBusy == nil {
					return "n/a"
				}
				return fmt.Sprintf("%.3f", *mr.Throughput.GPUBusy)
			})
		}
		row("pipeline wall: lead-in / engine / idle gaps / tail (ms)", "", func(mr *modelReport) string {
			t := mr.Throughput.Split
			return fmt.Sprintf("%.0f / %.0f / %.0f / %.0f", t.LeadInMs, t.EngineMs, t.IdleGapsMs, t.TailMs)
		})
		row("padding efficiency, ours", paddingTarget.String(), func(mr *modelReport) string { return ratio(mr.Padding.Ours, mr.Padding.OK) })
		row("padding efficiency, arrival order", "", func(mr *modelReport) string { return fmt.Sprintf("%.3f", mr.Padding.ArrivalOrder) })
		row("tokenizer (tokens/s, 1 thread)", "", func(mr *modelReport) string { return f1(mr.Tokenizer.TokensPerSec) })
		row("tokenizer share of pipeline CPU", tokenizerShareTarget.String(), func(mr *modelReport) string {
			return fmt.Sprintf("%.2f%% %s", 100*mr.Tokenizer.Share, mark(mr.Tokenizer.OK))
		})
		row("latency saturation p50 / p95 / p99 (ms)", "", func(mr *modelReport) string {
			l := mr.LatencySaturation
			return fmt.Sprintf("%.0f / %.0f / %.0f", l.P50Ms, l.P95Ms, l.P99Ms)
		})
	}
	if want("latency") && ranLatency(r) {
		row("latency low rate p50 / p95 / p99 (ms)", "", func(mr *modelReport) string {
			if mr.LatencyLow == nil {
				return "skipped"
			}
			l := mr.LatencyLow
			return fmt.Sprintf("%.0f / %.0f / %.0f", l.P50Ms, l.P95Ms, l.P99Ms)
		})
		row("low-rate bound: wait + 2 × batch score (ms)", "p99 ≤ bound", func(mr *modelReport) string {
			if mr.LatencyLow == nil {
				return "skipped"
			}
			l := mr.LatencyLow
			return fmt.Sprintf("%.0f + 2×%.0f = %.0f %s", l.BatchMaxWaitMs, l.BatchScoreMs, l.BoundMs, mark(*l.BoundOK))
		})
	}
	nPoints := 0
	if want("memory") {
		for _, mr := range r.Models {
			nPoints = max(nPoints, len(mr.Memory.Points))
		}
	}
	for i := range nPoints {
		var label string
		for _, mr := range r.Models {
			if i < len(mr.Memory.Points) {
				p := mr.Memory.Points[i]
				label = fmt.Sprintf("scorer peak RSS, backlog %d× (%d records) (MiB; fetched/scored)", p.Multiple, p.Backlog)
			}
		}
		row(label, "", func(mr *modelReport) string {
			if i >= len(mr.Memory.Points) {
				return "-"
			}
			p := mr.Memory.Points[i]
			return fmt.Sprintf("%.0f (%d/%d)", p.PeakRSSMiB, max(p.Fetched, 0), max(p.Scored, 0))
		})
	}
	if nPoints >= 2 {
		row("peak RSS growth, largest vs smallest backlog", memoryGrowthTarget.String()+" (flat)", func(mr *modelReport) string {
			if mr.Memory.Flat == nil {
				return "-"
			}
			return fmt.Sprintf("%+.1f%% %s", 100*mr.Memory.Growth, mark(*mr.Memory.Flat))
		})
	}
	if want("scaling") && len(r.Models) > 0 {
		for i, p := range r.Models[0].Scaling {
			row(fmt.Sprintf("CPU pool, %d thread(s) × %d worker(s) (pairs/s)", p.Threads, p.Workers), "", func(mr *modelReport) string {
				if i >= len(mr.Scaling) {
					return "-"
				}
				return f1(mr.Scaling[i].PairsPerSec)
			})
		}
	}
	tw.Flush()
}

func f1(v float64) string { return fmt.Sprintf("%.1f", v) }

func ratio(v float64, ok bool) string { return fmt.Sprintf("%.3f %s", v, mark(ok)) }

func mark(ok bool) string {
	if ok {
		return "ok"
	}
	return "MISS"
}

// printPerfTable writes the batch-shape, revision and int8 rows of the
// sections want accepts (shapes, revision, int8), a column per model folder.
func printPerfTable(w io.Writer, ps []perfReport, want func(section string) bool) {
	if len(ps) == 0 {
		return
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	head := "metric"
	for _, p := range ps {
		head += "\t" + p.Model
	}
	fmt.Fprintln(tw, head+"\ttarget")
	row := func(name, target string, f func(p *perfReport) string) {
		line := name
		for i := range ps {
			line += "\t" + f(&ps[i])
		}
		fmt.Fprintln(tw, line+"\t"+target)
	}
	// Shape rows: the union of every folder's settings, in first-seen order.
	var shapes []cpuShape
	seen := map[cpuShape]bool{}
	for _, p := range ps {
		if !want("shapes") {
			break
		}
		for _, sp := range p.Shapes {
			if !seen[sp.cpuShape] {
				seen[sp.cpuShape] = true
				shapes = append(shapes, sp.cpuShape)
			}
		}
	}
	for _, s := range shapes {
		row(fmt.Sprintf("CPU shape %dw×%dt, rows %d, tokens %d (pairs/s; pairs/CPU-s)", s.Workers, s.Threads, s.Rows, s.Tokens), "", func(p *perfReport) string {
			best := 0.0
			for _, sp := range p.Shapes {
				best = max(best, sp.PairsPerCPUSec)
			}
			for _, sp := range p.Shapes {
				if sp.cpuShape == s {
					rel := fmt.Sprintf("(%.2f)", sp.PairsPerCPUSec/best)
					if sp.PairsPerCPUSec == best {
						rel = "best"
					}
					return fmt.Sprintf("%.1f; %.1f %s", sp.PairsPerSec, sp.PairsPerCPUSec, rel)
				}
			}
			return "-"
		})
	}
	rev := func(f func(r *revisionResult) string) func(p *perfReport) string {
		return func(p *perfReport) string {
			if p.Revision == nil {
				return "-"
			}
			return f(p.Revision)
		}
	}
	if want("revision") && slices.ContainsFunc(ps, func(p perfReport) bool { return p.Revision != nil }) {
		printRevisionRows(row, rev)
	}
	i8 := func(f func(r *int8Result) string) func(p *perfReport) string {
		return func(p *perfReport) string {
			if p.Int8 == nil {
				return "-"
			}
			return f(p.Int8)
		}
	}
	if want("int8") && slices.ContainsFunc(ps, func(p perfReport) bool { return p.Int8 != nil }) {
		printInt8Rows(row, i8)
	}
	tw.Flush()
}

// printRevisionRows writes the revision workload's rows through row.
func printRevisionRows(row func(name, target string, f func(p *perfReport) string), rev func(f func(r *revisionResult) string) func(p *perfReport) string) {
	row("revision workload (transcripts × versions, edited / version)", "", rev(func(r *revisionResult) string {
		return fmt.Sprintf("%d × %d, %.0f%%", r.Transcripts, r.Versions, 100*r.EditShare)
	}))
	row("revision: pairs / inferred, cache off / on", "", rev(func(r *revisionResult) string {
		return fmt.Sprintf("%d / %d / %d", r.Pairs, r.InferredOff, r.InferredOn)
	}))
	row("revision: inference pairs saved by the cache", revisionSavedTarget.String(), rev(func(r *revisionResult) string {
		return fmt.Sprintf("%.1f%% %s", 100*r.Saved, mark(revisionSavedTarget.ok(r.Saved)))
	}))
	row("revision: pairs/s cache off / on", "", rev(func(r *revisionResult) string {
		return fmt.Sprintf("%.1f / %.1f", r.PairsPerSecOff, r.PairsPerSecOn)
	}))
	row("revision: speedup, cache on / off, wall; per CPU-second", revisionSpeedTarget.String(), rev(func(r *revisionResult) string {
		return fmt.Sprintf("%.2f×; %.2f× %s", r.Speedup, r.CPUSpeedup, mark(revisionSpeedTarget.ok(max(r.Speedup, r.CPUSpeedup))))
	}))
	row("revision: cache bytes / entries (cap)", "", rev(func(r *revisionResult) string {
		return fmt.Sprintf("%d / %d (%d)", r.CacheBytes, r.CacheEntries, r.CacheCapBytes)
	}))
	row("revision, capped cache: bytes / cap, evictions, inferred", "bytes ≤ cap", rev(func(r *revisionResult) string {
		return fmt.Sprintf("%d / %d, %d, %d %s", r.CappedBytes, r.CappedCapBytes, r.CappedEvictions, r.CappedInferred, mark(r.CappedBytes <= r.CappedCapBytes))
	}))
	row("revision, capped cache: bench RSS after each version (MiB)", "flat", rev(func(r *revisionResult) string {
		parts := make([]string, len(r.CappedRSSMiB))
		for i, v := range r.CappedRSSMiB {
			parts[i] = fmt.Sprintf("%.0f", v)
		}
		return strings.Join(parts, " / ")
	}))
}

// printInt8Rows writes the fp32-vs-int8 rows through row.
func printInt8Rows(row func(name, target string, f func(p *perfReport) string), i8 func(f func(r *int8Result) string) func(p *perfReport) string) {
	row("fp32 / int8 pairs/s (speedup)", "", i8(func(r *int8Result) string {
		return fmt.Sprintf("%.1f / %.1f (%.2f×)", r.FP32PairsPerSec, r.Int8PairsPerSec, r.Speedup)
	}))
	row("int8 vs fp32: max / p99 |Δp| (pairs)", "", i8(func(r *int8Result) string {
		return fmt.Sprintf("%.4f / %.4f (%d)", r.MaxAbsDiff, r.P99AbsDiff, r.Pairs)
	}))
	row("int8 vs fp32: decisions agreeing at 0.5 / at THRESHOLD", "", i8(func(r *int8Result) string {
		return fmt.Sprintf("%.2f%% / %.2f%%", 100*r.Agreement05, 100*r.AgreementThresh)
	}))
}

// servedRows reports whether r's pipeline runs counted the sample's pairs
// apart from the engine's (runs before the pipeline ran with the service's
// score cache did not).
func servedRows(r *benchReport) bool {
	for _, mr := range r.Models {
		if mr.Throughput.SamplePairs > 0 {
			return true
		}
	}
	return false
}
