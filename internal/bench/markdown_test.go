package bench

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// testReport is a report of a run on two models whose pipeline, memory and
// whole-process sections ran, the pipeline on a machine others loaded.
func testReport() *benchReport {
	flat := true
	return &benchReport{
		Machine:  machine{CPU: "Test CPU 9000", Cores: 2, MemoryGiB: 23.5, OS: "linux/amd64", GoVersion: "go1.26.8", ORTVersion: "1.30.0", Date: "2026-11-25T12:00:00Z"},
		Settings: benchSettings{Device: "auto", MaxBatchTokens: 16384, MaxBatchRows: 256, CPUMaxBatchRows: 16, Labels: 3},
		Sections: map[string]sectionRun{
			"pipeline":  {Start: "2026-11-25T12:00:05Z", End: "2026-11-25T12:04:00Z", Seconds: 200, OtherCPUSeconds: 150},
			"memory":    {Start: "2026-11-25T12:04:00Z", End: "2026-11-25T12:06:00Z", Seconds: 100, OtherCPUSeconds: 5},
			"wholeproc": {Start: "2026-11-25T12:06:00Z", End: "2026-11-25T12:08:00Z", Seconds: 100, OtherCPUSeconds: -1},
		},
		Models: []modelReport{
			{Model: "small-a", SHA256: "0123456789abcdef", Throughput: throughputResult{Pairs: 1000, PipelinePairsPerSec: 812.5, Ratio: 0.97, OK: true},
				Memory: memoryResult{Points: []memoryPoint{{Multiple: 20, Backlog: 640, PeakRSSMiB: 300}, {Multiple: 60, Backlog: 1920, PeakRSSMiB: 310}}, Growth: 0.033, Flat: &flat}},
			{Model: "small-b", SHA256: "fedcba9876543210", Throughput: throughputResult{Pairs: 1000, PipelinePairsPerSec: 790.25, Ratio: 0.95, OK: true},
				Memory: memoryResult{Points: []memoryPoint{{Multiple: 20, Backlog: 640, PeakRSSMiB: 320}, {Multiple: 60, Backlog: 1920, PeakRSSMiB: 330}}, Growth: 0.031, Flat: &flat}},
		},
		WholeProcess: []wholeProcess{{Model: "small-a", Graph: "model.onnx", Input: "typical", Pairs: 900, ScorerPairsPerSec: 1234.5, ScorerPeakRSSMiB: 300}},
	}
}

// TestSectionBlock: each section's block says where and when its figures
// were taken (date, CPU, cores, ONNX Runtime, models, how busy the machine
// was, the JSON) and holds that section's rows only.
func TestSectionBlock(t *testing.T) {
	r := testReport()
	pipe := sectionBlock(r, "pipeline", "docs/b.json")
	for _, want := range []string{"Run 2026-11-25 12:00–12:04Z", "Test CPU 9000, 2 cores", "ONNX Runtime 1.30.0", "Go 1.26.8",
		"Models: small-a (sha256 0123456789ab…), small-b", "other processes used 0.75 of the 2 cores", "**a loaded machine**",
		"JSON: `docs/b.json`", "CPU_MAX_BATCH_ROWS=16", "812.5", "790.2"} {
		if !strings.Contains(pipe, want) {
			t.Errorf("pipeline block lacks %q:\n%s", want, pipe)
		}
	}
	if strings.Contains(pipe, "peak RSS") || strings.Contains(pipe, "whole process") {
		t.Errorf("pipeline block holds other sections' rows:\n%s", pipe)
	}
	mem := sectionBlock(r, "memory", "docs/b.json")
	if !strings.Contains(mem, "0.05 of the 2 cores meanwhile (a quiet machine)") || !strings.Contains(mem, "backlog 60× (1920 records)") ||
		strings.Contains(mem, "pipeline / raw") {
		t.Errorf("memory block:\n%s", mem)
	}
	whole := sectionBlock(r, "wholeproc", "")
	if !strings.Contains(whole, "could not be read") || !strings.Contains(whole, "Model: small-a (model.onnx).") ||
		!strings.Contains(whole, "1234.50") || strings.Contains(whole, "JSON:") {
		t.Errorf("whole-process block:\n%s", whole)
	}
	// A report from before sections were recorded still gets a header.
	r.Sections = nil
	if got := ranSections(r); strings.Join(got, ",") != "pipeline,memory,wholeproc" {
		t.Errorf("sections inferred from the data: %v", got)
	}
	if old := sectionBlock(r, "pipeline", "x.json"); !strings.Contains(old, "Run 2026-11-25T12:00:00Z (start of the run)") ||
		!strings.Contains(old, "not recorded") {
		t.Errorf("block of a report without sections:\n%s", old)
	}
}

// TestWriteMarkdown: a run replaces the blocks of the sections it ran and
// keeps the others; a file missing a block's markers is left unchanged.
func TestWriteMarkdown(t *testing.T) {
	dir := t.TempDir()
	f := filepath.Join(dir, "b.md")
	doc := "# B\n<!-- bench:pipeline:begin -->\nold pipeline\n<!-- bench:pipeline:end -->\nprose\n" +
		"<!-- bench:memory:begin -->\nold memory\n<!-- bench:memory:end -->\n" +
		"<!-- bench:wholeproc:begin -->\nold whole\n<!-- bench:wholeproc:end -->\n" +
		"<!-- bench:production:begin -->\nkept production\n<!-- bench:production:end -->\n"
	if err := os.WriteFile(f, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	r := testReport()
	written, err := writeMarkdown(f, "docs/b.json", r, map[string]bool{"memory": true})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(written, ",") != "pipeline,wholeproc" {
		t.Errorf("written %v, want pipeline and wholeproc (memory skipped)", written)
	}
	b, _ := os.ReadFile(f)
	got := string(b)
	for _, want := range []string{"# B\n<!-- bench:pipeline:begin -->\nRun 2026-11-25 12:00–12:04Z", "prose\n", "old memory", "kept production",
		sectionBlock(r, "wholeproc", "docs/b.json")} {
		if !strings.Contains(got, want) {
			t.Errorf("after the run the file lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "old pipeline") || strings.Contains(got, "old whole") {
		t.Errorf("a block of a section that ran was kept:\n%s", got)
	}

	bare := filepath.Join(dir, "bare.md")
	if err := os.WriteFile(bare, []byte("<!-- bench:pipeline:begin -->\nx\n<!-- bench:pipeline:end -->\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := writeMarkdown(bare, "", r, nil); err == nil || !strings.Contains(err.Error(), "<!-- bench:memory:begin -->") {
		t.Errorf("missing markers: %v, want an error naming them", err)
	}
	if b, _ := os.ReadFile(bare); string(b) != "<!-- bench:pipeline:begin -->\nx\n<!-- bench:pipeline:end -->\n" {
		t.Errorf("a failed write changed the file:\n%s", b)
	}
}

// TestMeter: a section run once per model sums its spans, from the first
// start to the last end, and never counts its own CPU as other processes'.
func TestMeter(t *testing.T) {
	clock := time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)
	mt := newMeter()
	mt.now = func() time.Time { return clock }
	for range 2 {
		end := mt.begin("pipeline")
		clock = clock.Add(30 * time.Second)
		end()
		clock = clock.Add(10 * time.Second)
	}
	run := mt.report()["pipeline"]
	if run.Start != "2026-11-25T12:00:00Z" || run.End != "2026-11-25T12:01:10Z" || run.Seconds != 60 {
		t.Errorf("run %+v, want 12:00:00 to 12:01:10, 60 s", run)
	}
	if run.OtherCPUSeconds < 0 && machineBusySeconds() >= 0 {
		t.Errorf("other CPU %v with /proc/stat readable", run.OtherCPUSeconds)
	}
}
