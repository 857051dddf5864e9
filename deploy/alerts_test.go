package deploy

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/scorer/scorer/internal/testenv"
)

const (
	alertsFile     = "helm/scorer/files/alerts.yaml"
	alertTestsFile = "prometheus/alerts_test.yaml"
	operatingDoc   = "../docs/operating.md"
	// runbookBase is the runbook page every alert links to; the chart's prometheusRule.runbookBaseURL
	// replaces exactly this prefix.
	runbookBase = "https://github.com/scorer/scorer/blob/main/docs/operating.md"
	// composeRulesPath is where compose mounts alertsFile inside the Prometheus container.
	composeRulesPath = "/etc/prometheus/rules/scorer-alerts.yaml"
)

// notOnCPU are metrics a CPU-only scorer with a healthy broker never creates a series for: they have
// device or failure labels that only a GPU, a failed dead-letter write or an offset reset produces. The scrape cannot
// show them, so the test checks instead that the code registers them by that name.
var notOnCPU = map[string]string{
	"scorer_gpu_memory_free_bytes":  "per GPU device",
	"scorer_gpu_memory_used_bytes":  "per GPU device",
	"scorer_admission_total":        "per GPU admission decision",
	"scorer_oom_retries_total":      "per device, on an out-of-memory split",
	"scorer_dlq_write_errors_total": "per kind, on a failed dead-letter write",
	"scorer_gpu_degraded":           "per GPU device",
	"scorer_gpu_busy_ratio":         "per GPU, from NVML's utilization",
	"scorer_offset_resets_total":    "per partition, when a committed offset is out of range",
}

type alertRule struct {
	Alert       string            `yaml:"alert"`
	Record      string            `yaml:"record"`
	Expr        string            `yaml:"expr"`
	For         string            `yaml:"for"`
	Labels      map[string]string `yaml:"labels"`
	Annotations map[string]string `yaml:"annotations"`
}

type ruleGroup struct {
	Name  string      `yaml:"name"`
	Rules []alertRule `yaml:"rules"`
}

func readAlertRules(t *testing.T) []ruleGroup {
	t.Helper()
	data, err := os.ReadFile(alertsFile)
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Groups []ruleGroup `yaml:"groups"`
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&f); err != nil {
		t.Fatalf("parse %s: %v", alertsFile, err)
	}
	if len(f.Groups) == 0 {
		t.Fatalf("%s: no rule groups", alertsFile)
	}
	return f.Groups
}

// alertMetrics maps each scorer metric the alerts query to the alerts that query it.
func alertMetrics(groups []ruleGroup) map[string][]string {
	m := map[string][]string{}
	for _, g := range groups {
		for _, r := range g.Rules {
			for _, name := range metricRe.FindAllString(r.Expr, -1) {
				m[name] = append(m[name], r.Alert)
			}
		}
	}
	return m
}

// githubAnchor is the fragment GitHub gives a Markdown heading: lower case, punctuation other than
// '-' and '_' dropped, spaces turned into '-'.
func githubAnchor(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(heading)) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9':
			b.WriteRune(r)
		}
	}
	return b.String()
}

// docAnchors returns the anchors of the headings in a Markdown file and, per anchor, the text of its
// section (up to the next heading of any level).
func docAnchors(t *testing.T, path string) map[string]string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	cur := ""
	inFence := false
	for line := range strings.SplitSeq(string(data), "\n") {
		if strings.HasPrefix(line, "```") {
			inFence = !inFence
		}
		if !inFence && strings.HasPrefix(line, "#") {
			cur = githubAnchor(strings.TrimLeft(line, "#"))
			out[cur] = ""
			continue
		}
		if cur != "" {
			out[cur] += line + "\n"
		}
	}
	return out
}

func TestAlertRules(t *testing.T) {
	groups := readAlertRules(t)
	d := readDesign(t)
	anchors := docAnchors(t, operatingDoc)
	seen := map[string]bool{}
	for _, g := range groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				t.Errorf("group %s: a rule without an alert name (recording rules belong elsewhere): %q", g.Name, r.Expr)
				continue
			}
			if seen[r.Alert] {
				t.Errorf("alert %s defined twice", r.Alert)
			}
			seen[r.Alert] = true
			if !strings.HasPrefix(r.Alert, "Scorer") {
				t.Errorf("alert %s: name does not start with Scorer", r.Alert)
			}
			if s := r.Labels["severity"]; s != "critical" && s != "warning" {
				t.Errorf("alert %s: severity %q, want critical or warning", r.Alert, s)
			}
			for _, k := range []string{"summary", "description", "runbook_url"} {
				if strings.TrimSpace(r.Annotations[k]) == "" {
					t.Errorf("alert %s: no %s annotation", r.Alert, k)
				}
			}
			// The summary names where: the pod (or instance), plus the partition or device when the
			// alert is about one.
			sum := r.Annotations["summary"]
			if !strings.Contains(sum, "$labels.pod") && !strings.Contains(sum, "$labels.job") {
				t.Errorf("alert %s: summary %q names no pod", r.Alert, sum)
			}
			if strings.Contains(r.Expr, "scorer_committed_lag") || strings.Contains(r.Expr, "_unacked_") || strings.Contains(r.Expr, "partition_paused") {
				if !strings.Contains(sum, "$labels.partition") {
					t.Errorf("alert %s: summary %q does not name the partition", r.Alert, sum)
				}
			}
			url := r.Annotations["runbook_url"]
			anchor, ok := strings.CutPrefix(url, runbookBase+"#")
			if !ok {
				t.Errorf("alert %s: runbook_url %q does not start with %s#", r.Alert, url, runbookBase)
				continue
			}
			if anchor != strings.ToLower(r.Alert) {
				t.Errorf("alert %s: runbook anchor %q, want %q (a heading named after the alert)", r.Alert, anchor, strings.ToLower(r.Alert))
			}
			section, ok := anchors[anchor]
			if !ok {
				t.Errorf("alert %s: %s has no heading with anchor #%s", r.Alert, operatingDoc, anchor)
			} else if len(strings.Fields(section)) < 40 {
				t.Errorf("alert %s: runbook section #%s is %d words; say what it means and what to do", r.Alert, anchor, len(strings.Fields(section)))
			}
		}
	}
	if len(seen) < 10 {
		t.Fatalf("only %d alerts parsed from %s", len(seen), alertsFile)
	}
	for name, alerts := range alertMetrics(groups) {
		base := histSufRe.ReplaceAllString(name, "")
		if !d.metrics[name] && !d.metrics[base] {
			t.Errorf("alerts %v query %s, which is not in the metrics list of %s", alerts, name, designDoc)
		}
	}

	t.Run("unit tests cover every alert", func(t *testing.T) {
		data, err := os.ReadFile(alertTestsFile)
		if err != nil {
			t.Fatal(err)
		}
		var f struct {
			RuleFiles []string `yaml:"rule_files"`
			Tests     []struct {
				Name          string `yaml:"name"`
				AlertRuleTest []struct {
					Alertname string `yaml:"alertname"`
					ExpAlerts []any  `yaml:"exp_alerts"`
				} `yaml:"alert_rule_test"`
			} `yaml:"tests"`
		}
		if err := yaml.Unmarshal(data, &f); err != nil {
			t.Fatalf("parse %s: %v", alertTestsFile, err)
		}
		want := filepath.Join("..", alertsFile)
		if !slices.Equal(f.RuleFiles, []string{want}) {
			t.Errorf("%s: rule_files = %v, want [%s]", alertTestsFile, f.RuleFiles, want)
		}
		firing, silent := map[string]bool{}, map[string]bool{}
		for _, tc := range f.Tests {
			for _, a := range tc.AlertRuleTest {
				if !seen[a.Alertname] {
					t.Errorf("%s: test %q checks %s, which is no alert", alertTestsFile, tc.Name, a.Alertname)
				}
				if len(a.ExpAlerts) > 0 {
					firing[a.Alertname] = true
				} else {
					silent[a.Alertname] = true
				}
			}
		}
		for a := range seen {
			if !firing[a] {
				t.Errorf("%s: no test where %s fires", alertTestsFile, a)
			}
			if !silent[a] {
				t.Errorf("%s: no test where %s does not fire", alertTestsFile, a)
			}
		}
	})

	t.Run("promtool", func(t *testing.T) {
		promtool := promtoolBin(t)
		for _, args := range [][]string{{"check", "rules", alertsFile}, {"test", "rules", alertTestsFile}} {
			out, err := exec.Command(promtool, args...).CombinedOutput()
			if err != nil {
				t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
			} else if !bytes.Contains(out, []byte("SUCCESS")) {
				t.Errorf("promtool %s printed no SUCCESS:\n%s", strings.Join(args, " "), out)
			}
		}
	})
}

// promtoolBin returns promtool ($PROMTOOL or on PATH) or skips the calling (sub)test.
func promtoolBin(t *testing.T) string {
	t.Helper()
	return toolBin(t, "PROMTOOL", "promtool", "`promtool check/test rules`",
		"`make promtool` installs it (Debian's prometheus package)")
}

func TestAlertRulesCompose(t *testing.T) {
	data, err := os.ReadFile(prometheusFile)
	if err != nil {
		t.Fatal(err)
	}
	var prom struct {
		RuleFiles []string `yaml:"rule_files"`
	}
	if err := yaml.Unmarshal(data, &prom); err != nil {
		t.Fatalf("parse %s: %v", prometheusFile, err)
	}
	if !slices.Contains(prom.RuleFiles, composeRulesPath) {
		t.Errorf("%s: rule_files = %v, want it to load %s", prometheusFile, prom.RuleFiles, composeRulesPath)
	}
	// compose resolves the host side relative to compose.yaml's directory.
	host := "../" + alertsFile
	wantMount := host + ":" + composeRulesPath + ":ro"
	vols := readCompose(t).Services["prometheus"].Volumes
	if !slices.Contains(vols, wantMount) {
		t.Errorf("compose: prometheus volumes %v lack %q (the one rules file the chart uses too)", vols, wantMount)
	}
	if _, err := os.Stat(filepath.Join(filepath.Dir(composeFile), host)); err != nil {
		t.Errorf("compose: rules mount source: %v", err)
	}

	// promtool check config on prometheus.yml as the container sees it: the rules path pointed at the
	// mounted file.
	t.Run("promtool check config", func(t *testing.T) {
		promtool := promtoolBin(t)
		abs, err := filepath.Abs(alertsFile)
		if err != nil {
			t.Fatal(err)
		}
		cfg := filepath.Join(t.TempDir(), "prometheus.yml")
		if err := os.WriteFile(cfg, bytes.ReplaceAll(data, []byte(composeRulesPath), []byte(abs)), 0o644); err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command(promtool, "check", "config", cfg).CombinedOutput()
		if err != nil || !bytes.Contains(out, []byte("rules found")) {
			t.Errorf("promtool check config: %v\n%s", err, out)
		}
	})
}

// TestPrometheusRuleChart renders the chart's PrometheusRule and checks it carries exactly the rules
// of alertsFile, and that the tuning values do what values.yaml says.
func TestPrometheusRuleChart(t *testing.T) {
	helm := helmBin(t)
	groups := readAlertRules(t)
	render := func(t *testing.T, set ...string) (map[string]object, string, error) {
		t.Helper()
		args := []string{"template", "rel", chartDir, "--namespace", "prod", "--kube-version", kubeVersion}
		for _, s := range set {
			args = append(args, "--set", s)
		}
		out, err := runHelm(t, helm, args...)
		if err != nil {
			return nil, out, err
		}
		return parseManifests(t, out), out, nil
	}
	ruleGroups := func(t *testing.T, objs map[string]object) []ruleGroup {
		t.Helper()
		pr, ok := objs["PrometheusRule"]
		if !ok || get(pr, "metadata", "name") != "rel-scorer" {
			t.Fatalf("no PrometheusRule rendered; objects: %v", slices.Sorted(mapsKeys(objs)))
		}
		raw, err := yaml.Marshal(get(pr, "spec"))
		if err != nil {
			t.Fatal(err)
		}
		var spec struct {
			Groups []ruleGroup `yaml:"groups"`
		}
		dec := yaml.NewDecoder(bytes.NewReader(raw))
		dec.KnownFields(true)
		if err := dec.Decode(&spec); err != nil {
			t.Fatalf("PrometheusRule spec: %v", err)
		}
		return spec.Groups
	}

	t.Run("off by default", func(t *testing.T) {
		objs, out, err := render(t)
		if err != nil {
			t.Fatalf("helm template: %v\n%s", err, out)
		}
		for k := range objs {
			if k == "PrometheusRule" {
				t.Errorf("default render has %s", k)
			}
		}
		objs, out, err = render(t, "prometheusRule.enabled=true")
		if err != nil {
			t.Fatalf("helm template: %v\n%s", err, out)
		}
		if _, ok := objs["PrometheusRule"]; ok {
			t.Error("PrometheusRule rendered without the CRD's API known (and skipCRDCheck false)")
		}
	})

	t.Run("same rules as the compose file", func(t *testing.T) {
		objs, out, err := render(t, "prometheusRule.enabled=true", "prometheusRule.skipCRDCheck=true", "prometheusRule.labels.release=kps")
		if err != nil {
			t.Fatalf("helm template: %v\n%s", err, out)
		}
		if got := ruleGroups(t, objs); !reflect.DeepEqual(got, groups) {
			t.Errorf("PrometheusRule groups differ from %s:\n got %+v\nwant %+v", alertsFile, got, groups)
		}
		if l := get(objs["PrometheusRule"], "metadata", "labels", "release"); l != "kps" {
			t.Errorf("PrometheusRule label release = %v, want kps", l)
		}
	})

	t.Run("tuned", func(t *testing.T) {
		const newExpr = "sum by (namespace, job, pod, instance, reason) (rate(scorer_dlq_total[5m])) > 0.5"
		objs, out, err := render(t, "prometheusRule.enabled=true", "prometheusRule.skipCRDCheck=true",
			"prometheusRule.runbookBaseURL=https://wiki.example.test/scorer/",
			"prometheusRule.additionalLabels.team=ml",
			"prometheusRule.rules.ScorerGPUFallback.enabled=false",
			"prometheusRule.rules.ScorerDown.severity=page",
			"prometheusRule.rules.ScorerDown.for=2m",
			// helm's --set splits on commas
			"prometheusRule.rules.ScorerDLQRateHigh.expr="+strings.ReplaceAll(newExpr, ",", `\,`))
		if err != nil {
			t.Fatalf("helm template: %v\n%s", err, out)
		}
		got := map[string]alertRule{}
		for _, g := range ruleGroups(t, objs) {
			for _, r := range g.Rules {
				got[r.Alert] = r
			}
		}
		n := 0
		for _, g := range groups {
			for _, src := range g.Rules {
				r, ok := got[src.Alert]
				if src.Alert == "ScorerGPUFallback" {
					if ok {
						t.Error("ScorerGPUFallback rendered though rules.ScorerGPUFallback.enabled=false")
					}
					continue
				}
				n++
				if !ok {
					t.Errorf("%s missing from the tuned render", src.Alert)
					continue
				}
				wantURL := strings.Replace(src.Annotations["runbook_url"], runbookBase, "https://wiki.example.test/scorer", 1)
				if r.Annotations["runbook_url"] != wantURL {
					t.Errorf("%s: runbook_url %q, want %q", src.Alert, r.Annotations["runbook_url"], wantURL)
				}
				if r.Labels["team"] != "ml" {
					t.Errorf("%s: labels %v lack team=ml", src.Alert, r.Labels)
				}
				wantSev, wantFor, wantExpr := src.Labels["severity"], src.For, src.Expr
				switch src.Alert {
				case "ScorerDown":
					wantSev, wantFor = "page", "2m"
				case "ScorerDLQRateHigh":
					wantExpr = newExpr
				}
				if r.Labels["severity"] != wantSev || r.For != wantFor || r.Expr != wantExpr {
					t.Errorf("%s: severity %q for %q expr %q; want %q %q %q", src.Alert, r.Labels["severity"], r.For, r.Expr, wantSev, wantFor, wantExpr)
				}
				if r.Annotations["summary"] != src.Annotations["summary"] {
					t.Errorf("%s: summary changed by the chart: %q", src.Alert, r.Annotations["summary"])
				}
			}
		}
		if n != len(got) {
			t.Errorf("tuned render has %d alerts, want %d", len(got), n)
		}
	})

	t.Run("unknown alert override fails", func(t *testing.T) {
		_, out, err := render(t, "prometheusRule.enabled=true", "prometheusRule.skipCRDCheck=true", "prometheusRule.rules.ScorerTypo.enabled=false")
		if err == nil || !strings.Contains(out, "prometheusRule.rules.ScorerTypo") {
			t.Errorf("a misspelt override rendered: err=%v\n%s", err, out)
		}
	})
}

func mapsKeys[V any](m map[string]V) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// dashboardMetrics returns every scorer metric the Grafana dashboard queries (histogram suffixes
// kept).
func dashboardMetrics(t *testing.T) []string {
	t.Helper()
	var names []string
	for _, e := range dashboardExprs(t) {
		names = append(names, metricRe.FindAllString(e, -1)...)
	}
	return names
}

var typeLineRe = regexp.MustCompile(`^# TYPE (\S+) (\S+)$`)

// TestMetricsExported runs the real scorer (real broker protocol, model and ONNX Runtime), drives real
// transcripts and one malformed record through it, scrapes /metrics and checks that every metric an
// alert or the dashboard queries is one it exports.
func TestMetricsExported(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a scorer and scores transcripts")
	}
	ortLib := testenv.ORTLib(t)
	modelDir := testenv.ScorerModelDir(t)
	transcripts := testenv.Transcripts(t)

	dir := t.TempDir()
	bin := filepath.Join(dir, "scorer")
	build := exec.Command("go", "build", "-o", bin, "../cmd/scorer")
	build.Env = append(os.Environ(), "CGO_ENABLED=1")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}

	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	brokerAddr, metricsAddr := freeAddr(t), freeAddr(t)
	start := func(name string, env []string, args ...string) {
		cmd := exec.CommandContext(ctx, bin, args...)
		cmd.Env = append(os.Environ(), env...)
		logf, err := os.Create(filepath.Join(dir, name+".log"))
		if err != nil {
			t.Fatal(err)
		}
		cmd.Stdout, cmd.Stderr = logf, logf
		cmd.WaitDelay = 10 * time.Second
		if err := cmd.Start(); err != nil {
			t.Fatalf("start %s: %v", name, err)
		}
		t.Cleanup(func() {
			_ = cmd.Process.Signal(os.Interrupt)
			_ = cmd.Wait()
			logf.Close()
			if t.Failed() {
				b, _ := os.ReadFile(logf.Name())
				t.Logf("%s log (tail):\n%s", name, tail(b, 3000))
			}
		})
	}
	start("broker", nil, "broker", "--addr", brokerAddr)
	start("scorer", []string{
		"KAFKA_BROKERS=" + brokerAddr, "MODEL_DIR=" + modelDir, "ORT_LIB=" + ortLib, "DEVICE=cpu",
		"METRICS_ADDR=" + metricsAddr, "LOG_FORMAT=json", "BATCH_MAX_WAIT=50ms", "WORKERS=1",
	}, "run")

	base := "http://" + metricsAddr
	waitFor(ctx, t, "scorer /readyz 200", func() (bool, string) {
		code, body := httpGet(ctx, base+"/readyz")
		return code == http.StatusOK, body
	})

	// Two short real transcripts and one record that is not JSON (a dead letter, so the DLQ series
	// appear).
	input := shortestLines(t, transcripts, 2)
	input = append(input, []byte("this is not a transcript event\n")...)
	produce := exec.CommandContext(ctx, bin, "produce", "--brokers", brokerAddr, "--topic", "transcripts", "--file", "-")
	produce.Stdin = bytes.NewReader(input)
	if out, err := produce.CombinedOutput(); err != nil {
		t.Fatalf("scorer produce: %v\n%s", err, out)
	}

	registered := registeredMetricNames(t)
	used := map[string][]string{}
	for name, alerts := range alertMetrics(readAlertRules(t)) {
		used[name] = append(used[name], alerts...)
	}
	for _, name := range dashboardMetrics(t) {
		used[name] = append(used[name], "dashboard")
	}
	// Some families appear only after the first commit tick (per-partition
	// lag and pause gauges), so the scrape is repeated until every queried
	// family that a CPU-only scorer can export is there, or the deadline
	// ends and the checks below name what is missing.
	var exported map[string]string
	scored := false
	has := func(name string) bool {
		_, ok := exported[name]
		if !ok {
			_, ok = exported[histSufRe.ReplaceAllString(name, "")]
		}
		return ok
	}
	waitCtx, waitCancel := context.WithTimeout(ctx, 60*time.Second)
	defer waitCancel()
	for {
		_, body := httpGet(ctx, base+"/metrics")
		exported = map[string]string{}
		for line := range strings.SplitSeq(body, "\n") {
			if m := typeLineRe.FindStringSubmatch(line); m != nil {
				exported[m[1]] = m[2]
			}
		}
		scored = strings.Contains(body, `kind="result"`) && strings.Contains(body, `kind="dlq"`) &&
			strings.Contains(body, `scorer_dlq_total{reason="malformed_json"}`)
		done := scored
		for name := range used {
			if _, gpuOnly := notOnCPU[histSufRe.ReplaceAllString(name, "")]; !gpuOnly && !has(name) {
				if _, gpuOnly := notOnCPU[name]; !gpuOnly {
					done = false
				}
			}
		}
		if done {
			break
		}
		select {
		case <-waitCtx.Done():
			t.Logf("/metrics after 60 s (tail):\n%s", tail([]byte(body), 2000))
		case <-time.After(200 * time.Millisecond):
			continue
		}
		break
	}
	if !scored {
		t.Fatal("no results and dead letter counted in /metrics within 60 s")
	}

	names := slices.Sorted(mapsKeys(used))
	for _, name := range names {
		fam := name
		if _, ok := exported[fam]; !ok {
			fam = histSufRe.ReplaceAllString(name, "")
			if exported[fam] != "" && exported[fam] != "histogram" {
				t.Errorf("%s (used by %v): %s is a %s, not a histogram", name, used[name], fam, exported[fam])
				continue
			}
		}
		_, isExported := exported[fam]
		_, gpuOnly := notOnCPU[fam]
		switch {
		case isExported:
		case gpuOnly:
			if !registered[fam] {
				t.Errorf("%s (used by %v) is registered nowhere in the code", fam, used[name])
			}
		default:
			t.Errorf("%s (used by %v) is not exported by a running scorer", name, used[name])
		}
	}
	for fam := range notOnCPU {
		if _, ok := exported[fam]; ok {
			t.Errorf("%s was exported by a CPU scorer: delete it from notOnCPU", fam)
		}
	}
	t.Logf("checked %d metric names against %d exported families", len(names), len(exported))
}

// registeredMetricNames collects the Name: "scorer_…" literals of the non-test Go code.
func registeredMetricNames(t *testing.T) map[string]bool {
	t.Helper()
	re := regexp.MustCompile(`Name:\s*"(scorer_[a-z0-9_]+)"`)
	out := map[string]bool{}
	err := filepath.WalkDir("..", func(path string, e os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if e.IsDir() && (e.Name() == ".deps" || e.Name() == ".git" || e.Name() == "node_modules") {
			return filepath.SkipDir
		}
		if e.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range re.FindAllSubmatch(data, -1) {
			out[string(m[1])] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// shortestLines returns the n shortest lines of a JSONL file, each with its newline.
func shortestLines(t *testing.T, path string, n int) []byte {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var lines [][]byte
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for sc.Scan() {
		if len(bytes.TrimSpace(sc.Bytes())) > 0 {
			lines = append(lines, bytes.Clone(sc.Bytes()))
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if len(lines) < n {
		t.Fatalf("%s: %d lines, want at least %d", path, len(lines), n)
	}
	sort.SliceStable(lines, func(i, j int) bool { return len(lines[i]) < len(lines[j]) })
	var out []byte
	for _, l := range lines[:n] {
		out = append(append(out, l...), '\n')
	}
	return out
}

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

func httpGet(ctx context.Context, url string) (int, string) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, err.Error()
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// waitFor polls cond every 200 ms until it holds or ctx ends (then the test fails with cond's last
// detail).
func waitFor(ctx context.Context, t *testing.T, what string, cond func() (bool, string)) {
	t.Helper()
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		ok, detail := cond()
		if ok {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("waiting for %s: %v; last: %s", what, ctx.Err(), detail)
		case <-tick.C:
		}
	}
}

func tail(b []byte, n int) string {
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}
