package bench

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/scorer/scorer/internal/measure"
)

// sectionRun is when one section ran and how busy the machine was
// meanwhile. A section that runs once per model accumulates its spans.
type sectionRun struct {
	Start   string  `json:"start"`
	End     string  `json:"end"`
	Seconds float64 `json:"seconds"`
	// OtherCPUSeconds is the machine's busy CPU time during the section
	// less this process's and its reaped children's: what other tenants
	// took. Negative when /proc/stat could not be read.
	OtherCPUSeconds float64 `json:"other_cpu_seconds"`
}

// loadedShare is the share of the machine's cores that other processes may
// use during a section before its block calls the machine loaded.
const loadedShare = 0.1

// meter records sectionRuns into a report.
type meter struct {
	runs map[string]*sectionRun
	now  func() time.Time
}

func newMeter() *meter { return &meter{runs: map[string]*sectionRun{}, now: time.Now} }

// begin starts timing section; the returned func ends the span.
func (mt *meter) begin(section string) (end func()) {
	start, busy0, own0 := mt.now(), machineBusySeconds(), ownCPUSeconds()
	return func() {
		stop, busy1, own1 := mt.now(), machineBusySeconds(), ownCPUSeconds()
		r := mt.runs[section]
		if r == nil {
			r = &sectionRun{Start: start.UTC().Format(time.RFC3339)}
			mt.runs[section] = r
		}
		r.End = stop.UTC().Format(time.RFC3339)
		r.Seconds += stop.Sub(start).Seconds()
		if busy0 < 0 || busy1 < 0 || r.OtherCPUSeconds < 0 {
			r.OtherCPUSeconds = -1
		} else {
			r.OtherCPUSeconds += max((busy1-busy0)-(own1-own0), 0)
		}
	}
}

// report returns the recorded runs by section name.
func (mt *meter) report() map[string]sectionRun {
	out := make(map[string]sectionRun, len(mt.runs))
	for k, v := range mt.runs {
		out[k] = *v
	}
	return out
}

// machineBusySeconds is the CPU time every core of the machine has spent
// busy since boot (/proc/stat's first line: all but idle and iowait, in
// USER_HZ, which Linux fixes at 100 for user space); -1 when unreadable.
func machineBusySeconds() float64 {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return -1
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		return -1
	}
	var busy float64
	for i, v := range f[1:9] { // user nice system idle iowait irq softirq steal
		n, err := strconv.ParseFloat(v, 64)
		if err != nil {
			return -1
		}
		if i != 3 && i != 4 {
			busy += n
		}
	}
	return busy / 100
}

// ownCPUSeconds is this process's CPU time plus its reaped children's (the
// broker, scorer and raw-loop processes the sections start and wait for).
func ownCPUSeconds() float64 {
	var children syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_CHILDREN, &children)
	return measure.CPUTime().Seconds() + time.Duration(children.Utime.Nano()+children.Stime.Nano()).Seconds()
}

// ranSections lists, in order, the sections with figures in r: those the
// run recorded, or for a report written before runs were recorded, those
// whose data is there.
func ranSections(r *benchReport) []string {
	var out []string
	for _, s := range sections {
		if r.Sections != nil {
			if _, ok := r.Sections[s.name]; ok {
				out = append(out, s.name)
			}
		} else if s.has(r) {
			out = append(out, s.name)
		}
	}
	return out
}

func ranPipeline(r *benchReport) bool {
	return slices.ContainsFunc(r.Models, func(m modelReport) bool { return m.Throughput.Pairs > 0 })
}

func ranLatency(r *benchReport) bool {
	return slices.ContainsFunc(r.Models, func(m modelReport) bool { return m.LatencyLow != nil })
}

// largeSuffix marks the --large-model stand-in's perf entry.
const largeSuffix = " (large stand-in)"

func smallPerf(r *benchReport) []perfReport {
	var out []perfReport
	for _, p := range r.Perf {
		if !strings.HasSuffix(p.Model, largeSuffix) {
			out = append(out, p)
		}
	}
	return out
}

func largePerf(r *benchReport) []perfReport {
	var out []perfReport
	for _, p := range r.Perf {
		if strings.HasSuffix(p.Model, largeSuffix) && (len(p.Shapes) > 0 || p.Int8 != nil) {
			out = append(out, p)
		}
	}
	return out
}

// sectionModels names the models a section's figures are about.
func sectionModels(r *benchReport, section string) []string {
	var out []string
	add := func(name string) {
		if !slices.Contains(out, name) {
			out = append(out, name)
		}
	}
	s := sectionNamed(section)
	if s == nil {
		return nil
	}
	switch s.table {
	case modelTable:
		for _, m := range r.Models {
			name := m.Model
			if len(m.SHA256) >= 12 {
				name += " (sha256 " + m.SHA256[:12] + "…)"
			}
			add(name)
		}
	case perfTable:
		for _, p := range smallPerf(r) {
			add(p.Model)
		}
	case largeTable:
		for _, p := range largePerf(r) {
			add(strings.TrimSuffix(p.Model, largeSuffix))
		}
	case wholeTable:
		graphs := map[string][]string{}
		for _, x := range r.WholeProcess {
			if wholeSection(r, x.Model) == section {
				add(x.Model)
				if !slices.Contains(graphs[x.Model], x.Graph) {
					graphs[x.Model] = append(graphs[x.Model], x.Graph)
				}
			}
		}
		for i, name := range out {
			out[i] = name + " (" + strings.Join(graphs[name], ", ") + ")"
		}
	}
	return out
}

// sectionBlock is the Markdown of one section: the conditions of the run
// that measured it (date, CPU, cores, ONNX Runtime, models, how busy the
// machine was, the JSON holding the run), then its table.
func sectionBlock(r *benchReport, section, jsonPath string) string {
	var b strings.Builder
	m := r.Machine
	when := m.Date + " (start of the run)"
	load := "other processes' CPU use was not recorded by this run"
	if run, ok := r.Sections[section]; ok {
		when = spanText(run.Start, run.End)
		switch {
		case run.OtherCPUSeconds < 0 || run.Seconds <= 0:
			load = "other processes' CPU use could not be read"
		default:
			cores := run.OtherCPUSeconds / run.Seconds
			state := "a quiet machine"
			if cores > loadedShare*float64(m.Cores) {
				state = "**a loaded machine**: wall-clock figures are disturbed, the per-CPU-second ones much less"
			}
			load = fmt.Sprintf("other processes used %.2f of the %d cores meanwhile (%s)", cores, m.Cores, state)
		}
	}
	fmt.Fprintf(&b, "Run %s: %s, %d cores, %.1f GiB, %s; ONNX Runtime %s, Go %s; %s",
		when, m.CPU, m.Cores, m.MemoryGiB, m.OS, m.ORTVersion, strings.TrimPrefix(m.GoVersion, "go"), load)
	if jsonPath != "" {
		fmt.Fprintf(&b, "; JSON: `%s`", jsonPath)
	}
	b.WriteString(".\n")
	models, noun := sectionModels(r, section), "Model"
	if len(models) > 1 {
		noun = "Models"
	}
	fmt.Fprintf(&b, "%s: %s. Settings: %s.\n\n", noun, strings.Join(models, ", "), settingsLine(r.Settings))
	var t bytes.Buffer
	if s := sectionNamed(section); s != nil {
		s.print(&t, r)
	}
	b.WriteString("```text\n")
	b.Write(t.Bytes())
	b.WriteString("```\n")
	return b.String()
}

// spanText shows a start and end time (RFC 3339) as one span.
func spanText(start, end string) string {
	s, err1 := time.Parse(time.RFC3339, start)
	e, err2 := time.Parse(time.RFC3339, end)
	if err1 != nil || err2 != nil {
		return start + " to " + end
	}
	if s.Format(time.DateOnly) == e.Format(time.DateOnly) {
		return s.Format("2006-01-02 15:04") + "–" + e.Format("15:04") + "Z"
	}
	return s.Format("2006-01-02 15:04") + "Z – " + e.Format("2006-01-02 15:04") + "Z"
}

// blockMarkers are the lines a --md file keeps around section's block.
func blockMarkers(section string) (begin, end string) {
	return "<!-- bench:" + section + ":begin -->", "<!-- bench:" + section + ":end -->"
}

// writeMarkdown replaces, in the Markdown file path, the block of every
// section in r that is not skipped, leaving the others as their own runs
// wrote them. It fails, changing nothing, when the file lacks a block's
// markers. It returns the sections written.
func writeMarkdown(path, jsonPath string, r *benchReport, skip map[string]bool) ([]string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	doc := string(b)
	var written, missing []string
	for _, s := range ranSections(r) {
		if skip[s] {
			continue
		}
		begin, end := blockMarkers(s)
		out, ok := replaceBlock(doc, begin, end, sectionBlock(r, s, jsonPath))
		if !ok {
			missing = append(missing, begin)
			continue
		}
		doc, written = out, append(written, s)
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("%s has no %s … end lines", path, strings.Join(missing, ", "))
	}
	return written, os.WriteFile(path, []byte(doc), 0o644)
}

// replaceBlock replaces the lines strictly between the begin and end
// marker lines of doc with text.
func replaceBlock(doc, begin, end, text string) (string, bool) {
	i := strings.Index(doc, begin+"\n")
	if i < 0 {
		return doc, false
	}
	j := strings.Index(doc[i:], end)
	if j < 0 {
		return doc, false
	}
	j += i
	return doc[:i+len(begin)+1] + text + doc[j:], true
}

// readReport loads a JSON report that `scorer bench --out` wrote.
func readReport(path string) (*benchReport, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var r benchReport
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return &r, nil
}
