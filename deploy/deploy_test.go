package deploy

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/scorer/scorer/schema"
)

// Paths relative to this package's directory (go test runs there).
const (
	designDoc      = "../docs/design.md"
	configDoc      = "../docs/configuration.md"
	makefile       = "../Makefile"
	composeFile    = "compose/compose.yaml"
	prometheusFile = "compose/prometheus.yml"
	sinkFile       = "compose/connect/jdbc-sink.json"
	dashboardFile  = "grafana/scorer-dashboard.json"
	cpuDockerfile  = "docker/Dockerfile"
	cudaDockerfile = "docker/Dockerfile.cuda"
	connectDocker  = "compose/connect/Dockerfile"
	chartDir       = "helm/scorer"
	cmdConfig      = "../internal/config/config.go"

	ortPins = "ort/pins.txt"
	// kubeVersion passed to helm: a helm built with `go install` (no release ldflags) assumes
	// Kubernetes v1.20, below the chart's kubeVersion constraint.
	kubeVersion = "1.31.0"
	nonRootUID  = 65532
)

// design holds what the docs document: the configuration variables (docs/configuration.md) and the
// metric names (docs/design.md).
type design struct {
	vars    map[string]bool
	metrics map[string]bool
}

var (
	configRowRe = regexp.MustCompile("(?m)^\\| `([A-Z][A-Z0-9_]*)` \\|")
	metricRe    = regexp.MustCompile(`\bscorer_[a-z0-9_]+`)
	histSufRe   = regexp.MustCompile(`_(bucket|sum|count)$`)
)

func readDesign(t *testing.T) design {
	t.Helper()
	d := design{vars: map[string]bool{}, metrics: map[string]bool{}}
	for m := range designMetrics(t) {
		d.metrics[m] = true
	}
	// The variables: the generated reference's tables, one row each.
	ref, err := os.ReadFile(configDoc)
	if err != nil {
		t.Fatalf("read configuration reference: %v", err)
	}
	for _, m := range configRowRe.FindAllSubmatch(ref, -1) {
		d.vars[string(m[1])] = true
	}
	if len(d.vars) < 20 || len(d.metrics) < 15 {
		t.Fatalf("design doc parse looks wrong: %d variables, %d metrics", len(d.vars), len(d.metrics))
	}
	return d
}

// rowKeyFields returns the json names of schema.RowKey's fields, in declaration order.
func rowKeyFields(t *testing.T) []string {
	t.Helper()
	typ := reflect.TypeFor[schema.RowKey]()
	var names []string
	for i := range typ.NumField() {
		tag := typ.Field(i).Tag.Get("json")
		name, _, _ := strings.Cut(tag, ",")
		if name == "" || name == "-" {
			t.Fatalf("schema.RowKey.%s has no json name", typ.Field(i).Name)
		}
		names = append(names, name)
	}
	return names
}

// ---- compose ----

type composeService struct {
	Image       string            `yaml:"image"`
	Build       any               `yaml:"build"`
	Environment map[string]string `yaml:"environment"`
	Volumes     []string          `yaml:"volumes"`
	ReadOnly    bool              `yaml:"read_only"`
	User        string            `yaml:"user"`
	DependsOn   any               `yaml:"depends_on"`
	Command     any               `yaml:"command"`
	Ports       []any             `yaml:"ports"`
}

type composeFileT struct {
	Services map[string]composeService `yaml:"services"`
}

func readCompose(t *testing.T) composeFileT {
	t.Helper()
	data, err := os.ReadFile(composeFile)
	if err != nil {
		t.Fatal(err)
	}
	var c composeFileT
	if err := yaml.Unmarshal(data, &c); err != nil {
		t.Fatalf("parse %s: %v", composeFile, err)
	}
	return c
}

// imagePinned reports whether ref names a fixed version: a digest, or a tag other than latest that
// contains a digit.
func imagePinned(ref string) bool {
	if strings.Contains(ref, "@sha256:") {
		return true
	}
	slash := strings.LastIndex(ref, "/")
	colon := strings.LastIndex(ref, ":")
	if colon <= slash {
		return false
	}
	tag := ref[colon+1:]
	return tag != "latest" && strings.ContainsAny(tag, "0123456789")
}

func TestCompose(t *testing.T) {
	d := readDesign(t)
	c := readCompose(t)

	for _, name := range []string{"kafka", "kafka-init", "scorer", "connect", "connect-init", "postgres", "prometheus", "grafana"} {
		if _, ok := c.Services[name]; !ok {
			t.Errorf("compose: service %q missing", name)
		}
	}
	for name, s := range c.Services {
		if s.Build != nil {
			continue // built from a Dockerfile here; its FROM lines are checked in TestDockerfiles
		}
		if s.Image == "" {
			t.Errorf("compose: service %q has neither image nor build", name)
		} else if !imagePinned(s.Image) {
			t.Errorf("compose: service %q image %q is not pinned to a version", name, s.Image)
		}
	}
	if img := c.Services["kafka"].Image; !strings.HasPrefix(img, "apache/kafka:") {
		t.Errorf("compose: kafka image = %q, want the official apache/kafka image", img)
	}
	// The demo services have no authentication (PLAINTEXT Kafka, Postgres scorer/scorer, Connect REST,
	// Grafana admin/admin): every published port is bound to the loopback interface only.
	published := 0
	for name, s := range c.Services {
		for _, p := range s.Ports {
			published++
			if !portOnLoopback(p) {
				t.Errorf("compose: service %q publishes %v on all interfaces; bind it to 127.0.0.1 (\"127.0.0.1:HOST:CONTAINER\")", name, p)
			}
		}
	}
	if published == 0 {
		t.Error("compose: no published ports found (parse problem?)")
	}
	if env := c.Services["kafka"].Environment; !strings.Contains(env["KAFKA_PROCESS_ROLES"], "controller") {
		t.Errorf("compose: kafka is not in KRaft combined mode: KAFKA_PROCESS_ROLES=%q", env["KAFKA_PROCESS_ROLES"])
	}

	sc := c.Services["scorer"]
	build, _ := sc.Build.(map[string]any)
	if build["dockerfile"] != "deploy/docker/Dockerfile" || build["context"] != "../.." {
		t.Errorf("compose: scorer build = %v, want context ../.. and dockerfile deploy/docker/Dockerfile", build)
	}
	var names []string
	for k := range sc.Environment {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		if !d.vars[k] {
			t.Errorf("compose: scorer env %s is not a variable documented in %s", k, configDoc)
		}
	}
	for k, want := range map[string]string{
		"KAFKA_BROKERS":     "kafka:9092",
		"OUTPUT_FORMAT":     "connect",
		"OUTPUT_ROWS_TOPIC": "transcripts.scores.rows",
		"MODEL_DIR":         "/models",
	} {
		if got := sc.Environment[k]; got != want {
			t.Errorf("compose: scorer %s = %q, want %q", k, got, want)
		}
	}
	if !slices.ContainsFunc(sc.Volumes, func(v string) bool { return strings.Contains(v, ":/models:ro") }) {
		t.Errorf("compose: scorer mounts no model read-only at /models: %v", sc.Volumes)
	}
	if !sc.ReadOnly || sc.User != strconv.Itoa(nonRootUID)+":"+strconv.Itoa(nonRootUID) {
		t.Errorf("compose: scorer read_only=%v user=%q, want read_only and %d:%d", sc.ReadOnly, sc.User, nonRootUID, nonRootUID)
	}

	// The topic-init job creates every topic the scorer uses.
	initCmd, _ := json.Marshal(c.Services["kafka-init"].Command)
	for _, k := range []string{"KAFKA_INPUT_TOPIC", "KAFKA_OUTPUT_TOPIC", "KAFKA_DLQ_TOPIC", "OUTPUT_ROWS_TOPIC"} {
		topic := sc.Environment[k]
		if topic == "" || !strings.Contains(string(initCmd), "--topic "+topic+" ") {
			t.Errorf("compose: kafka-init does not create %s=%q", k, topic)
		}
	}

	// Prometheus scrapes the scorer's metrics address.
	prom, err := os.ReadFile(prometheusFile)
	if err != nil {
		t.Fatal(err)
	}
	var pc struct {
		ScrapeConfigs []struct {
			StaticConfigs []struct {
				Targets []string `yaml:"targets"`
			} `yaml:"static_configs"`
		} `yaml:"scrape_configs"`
	}
	if err := yaml.Unmarshal(prom, &pc); err != nil {
		t.Fatalf("parse %s: %v", prometheusFile, err)
	}
	port := strings.TrimPrefix(sc.Environment["METRICS_ADDR"], ":")
	found := false
	for _, s := range pc.ScrapeConfigs {
		for _, st := range s.StaticConfigs {
			found = found || slices.Contains(st.Targets, "scorer:"+port)
		}
	}
	if port == "" || !found {
		t.Errorf("prometheus.yml does not scrape scorer:%s", port)
	}
}

// portOnLoopback reports whether a compose port entry, short ("127.0.0.1:9094:9094") or long
// ({host_ip: 127.0.0.1, ...}) syntax, publishes only on 127.0.0.1. A bare container port ("9094")
// publishes a random host port on all interfaces, so it does not count.
func portOnLoopback(p any) bool {
	switch v := p.(type) {
	case string:
		spec, _, _ := strings.Cut(v, "/") // drop /tcp, /udp
		parts := strings.Split(spec, ":")
		return len(parts) == 3 && parts[0] == "127.0.0.1"
	case map[string]any:
		return v["host_ip"] == "127.0.0.1"
	}
	return false
}

// TestComposePreflight runs load-and-check.sh --check: a missing or empty MODEL_HOST_DIR (which Docker
// would create empty, so the scorer restart-loops) must fail before `docker compose up` with a clear message.
func TestComposePreflight(t *testing.T) {
	bash, err := exec.LookPath("bash")
	if err != nil {
		t.Skip("no bash")
	}
	data := t.TempDir()
	if err := os.WriteFile(filepath.Join(data, "transcripts.jsonl"), []byte("{}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	model := t.TempDir()
	run := func(modelDir string) (string, error) {
		cmd := exec.Command(bash, "compose/load-and-check.sh", "--check")
		cmd.Env = append(os.Environ(), "MODEL_HOST_DIR="+modelDir, "TRANSCRIPTS_DIR="+data, "SCORER_BIN=")
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	for _, tc := range []struct{ dir, want string }{
		{filepath.Join(model, "missing"), "does not exist"},
		{model, "no config.json"},
	} {
		if out, err := run(tc.dir); err == nil || !strings.Contains(out, tc.want) {
			t.Errorf("load-and-check.sh --check with MODEL_HOST_DIR=%s: err=%v, want a failure saying %q; output:\n%s", tc.dir, err, tc.want, out)
		}
	}
	if err := os.WriteFile(filepath.Join(model, "config.json"), []byte("{}"), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := run(model); err != nil {
		t.Errorf("load-and-check.sh --check with a model directory: %v\n%s", err, out)
	}
	raw, _ := os.ReadFile("compose/load-and-check.sh")
	if !strings.Contains(string(raw), "compose up -d --build") {
		t.Error("load-and-check.sh --up does not run docker compose up after the check")
	}
}

// ---- JDBC sink ----

func TestJDBCSink(t *testing.T) {
	data, err := os.ReadFile(sinkFile)
	if err != nil {
		t.Fatal(err)
	}
	var sink struct {
		Name   string            `json:"name"`
		Config map[string]string `json:"config"`
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&sink); err != nil {
		t.Fatalf("parse %s (want {name, config} with string values): %v", sinkFile, err)
	}
	cfg := sink.Config
	if sink.Name == "" {
		t.Error("jdbc-sink: no connector name")
	}

	want := rowKeyFields(t)
	var got []string
	for _, f := range strings.Split(cfg["pk.fields"], ",") {
		got = append(got, strings.TrimSpace(f))
	}
	if !slices.Equal(got, want) {
		t.Errorf("jdbc-sink pk.fields = %v, want schema.RowKey's json fields %v", got, want)
	}

	rowsTopic := readCompose(t).Services["scorer"].Environment["OUTPUT_ROWS_TOPIC"]
	if cfg["topics"] != rowsTopic || rowsTopic == "" {
		t.Errorf("jdbc-sink topics = %q, want compose OUTPUT_ROWS_TOPIC %q", cfg["topics"], rowsTopic)
	}
	for k, v := range map[string]string{
		"connector.class":                "io.confluent.connect.jdbc.JdbcSinkConnector",
		"insert.mode":                    "upsert",
		"pk.mode":                        "record_key",
		"auto.create":                    "true",
		"key.converter":                  "org.apache.kafka.connect.json.JsonConverter",
		"value.converter":                "org.apache.kafka.connect.json.JsonConverter",
		"key.converter.schemas.enable":   "true",
		"value.converter.schemas.enable": "true",
	} {
		if cfg[k] != v {
			t.Errorf("jdbc-sink %s = %q, want %q", k, cfg[k], v)
		}
	}
}

// ---- Grafana ----

// dashboardExprs returns every expression anywhere in the dashboard (targets and templating queries).
func dashboardExprs(t *testing.T) []string {
	t.Helper()
	data, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var doc any
	if err := json.Unmarshal(data, &doc); err != nil {
		t.Fatalf("parse %s: %v", dashboardFile, err)
	}
	var exprs []string
	var walk func(v any, key string)
	walk = func(v any, key string) {
		switch v := v.(type) {
		case map[string]any:
			for k, x := range v {
				walk(x, k)
			}
		case []any:
			for _, x := range v {
				walk(x, key)
			}
		case string:
			if key == "expr" || key == "query" || key == "definition" {
				exprs = append(exprs, v)
			}
		}
	}
	walk(doc, "")
	return exprs
}

func TestDashboard(t *testing.T) {
	d := readDesign(t)
	data, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		UID    string           `json:"uid"`
		Title  string           `json:"title"`
		Panels []map[string]any `json:"panels"`
	}
	if err := json.Unmarshal(data, &dash); err != nil {
		t.Fatalf("parse %s: %v", dashboardFile, err)
	}
	if dash.UID == "" || dash.Title == "" || len(dash.Panels) == 0 {
		t.Fatalf("dashboard: uid=%q title=%q panels=%d", dash.UID, dash.Title, len(dash.Panels))
	}

	exprs := dashboardExprs(t)

	used := map[string]bool{}
	for _, e := range exprs {
		for _, m := range metricRe.FindAllString(e, -1) {
			base := m
			if !d.metrics[base] {
				base = histSufRe.ReplaceAllString(m, "")
			}
			if !d.metrics[base] {
				t.Errorf("dashboard queries %s, which is not in the metrics list of %s", m, designDoc)
			}
			used[base] = true
		}
	}
	for _, m := range []string{
		"scorer_messages_in_total", "scorer_messages_out_total", "scorer_pairs_scored_total",
		"scorer_batch_rows", "scorer_batch_tokens", "scorer_batch_padding_ratio", "scorer_queue_depth_pairs",
		"scorer_inflight_messages", "scorer_end_to_end_seconds", "scorer_commit_seconds", "scorer_consumer_lag",
		"scorer_dlq_total", "scorer_gpu_memory_used_bytes", "scorer_gpu_memory_free_bytes", "scorer_admission_total",
		"scorer_pool_devices",
	} {
		if !used[m] {
			t.Errorf("dashboard has no panel on %s", m)
		}
	}
	if !slices.ContainsFunc(exprs, func(e string) bool {
		return strings.Contains(e, "histogram_quantile(0.99") && strings.Contains(e, "scorer_end_to_end_seconds_bucket")
	}) {
		t.Error("dashboard: no p99 end-to-end latency (histogram_quantile over scorer_end_to_end_seconds_bucket)")
	}
}

// ---- Dockerfiles ----

type instruction struct {
	cmd  string // upper case
	args string
}

type stage struct {
	from, name string
	ins        []instruction
}

type dockerfile struct {
	globalArgs map[string]string
	stages     []stage
}

// parseDockerfile is a line parser good enough for our own files: comments, continuations, ARG
// defaults before the first FROM, FROM ... AS name.
func parseDockerfile(t *testing.T, path string) dockerfile {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	df := dockerfile{globalArgs: map[string]string{}}
	var logical []string
	var cur strings.Builder
	for _, line := range strings.Split(string(data), "\n") {
		trimmed := strings.TrimSpace(line)
		if strings.HasPrefix(trimmed, "#") || (trimmed == "" && cur.Len() == 0) {
			continue
		}
		if strings.HasSuffix(trimmed, "\\") {
			cur.WriteString(strings.TrimSuffix(trimmed, "\\") + " ")
			continue
		}
		cur.WriteString(trimmed)
		logical = append(logical, cur.String())
		cur.Reset()
	}
	for _, l := range logical {
		cmd, args, _ := strings.Cut(l, " ")
		in := instruction{cmd: strings.ToUpper(cmd), args: strings.TrimSpace(args)}
		if in.cmd == "FROM" {
			f := strings.Fields(in.args)
			st := stage{from: f[0]}
			if len(f) >= 3 && strings.EqualFold(f[1], "AS") {
				st.name = f[2]
			}
			df.stages = append(df.stages, st)
			continue
		}
		if len(df.stages) == 0 {
			if in.cmd == "ARG" {
				k, v, _ := strings.Cut(in.args, "=")
				df.globalArgs[k] = v
			}
			continue
		}
		last := &df.stages[len(df.stages)-1]
		last.ins = append(last.ins, in)
	}
	if len(df.stages) == 0 {
		t.Fatalf("%s: no FROM", path)
	}
	return df
}

var argRefRe = regexp.MustCompile(`\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?`)

func (df dockerfile) expand(s string) string {
	return argRefRe.ReplaceAllStringFunc(s, func(m string) string {
		return df.globalArgs[argRefRe.FindStringSubmatch(m)[1]]
	})
}

// final returns the last stage, the image that is shipped.
func (df dockerfile) final() stage { return df.stages[len(df.stages)-1] }

// env returns the final stage's ENV settings (KEY=value form).
func (st stage) env() map[string]string {
	env := map[string]string{}
	for _, in := range st.ins {
		if in.cmd != "ENV" {
			continue
		}
		for _, f := range strings.Fields(in.args) {
			if k, v, ok := strings.Cut(f, "="); ok {
				env[k] = v
			}
		}
	}
	return env
}

func (st stage) last(cmd string) (string, bool) {
	for i := len(st.ins) - 1; i >= 0; i-- {
		if st.ins[i].cmd == cmd {
			return st.ins[i].args, true
		}
	}
	return "", false
}

func checkDockerfileCommon(t *testing.T, path string, df dockerfile) {
	t.Helper()
	stages := map[string]bool{}
	for _, st := range df.stages {
		img := df.expand(st.from)
		if img != "scratch" && !stages[img] && !imagePinned(img) {
			t.Errorf("%s: FROM %s (= %q) is not pinned to a version", path, st.from, img)
		}
		if st.name != "" {
			stages[st.name] = true
		}
	}
	user, ok := df.final().last("USER")
	if !ok {
		t.Errorf("%s: final stage sets no USER", path)
	} else {
		uid, _, _ := strings.Cut(user, ":")
		if n, err := strconv.Atoi(uid); uid == "root" || (err == nil && n == 0) {
			t.Errorf("%s: USER %s is root", path, user)
		} else if err == nil && n != nonRootUID {
			t.Errorf("%s: USER %s, want uid %d", path, user, nonRootUID)
		}
	}
	if _, ok := df.final().last("HEALTHCHECK"); ok {
		t.Errorf("%s: HEALTHCHECK set; Kubernetes probes /healthz and /readyz instead", path)
	}
}

// pinRow is one row of deploy/ort/pins.txt.
type pinRow struct{ set, pkg, inner, name, sha string }

// readORTPins reads deploy/ort/pins.txt and checks its shape: every row
// set, package@version, path, name, SHA-256; a cpu set of one core from
// onnxruntime-node; a cuda set of one such core and the provider libraries.
func readORTPins(t *testing.T) []pinRow {
	t.Helper()
	data, err := os.ReadFile(ortPins)
	if err != nil {
		t.Fatal(err)
	}
	sha256Re := regexp.MustCompile(`^[0-9a-f]{64}$`)
	var rows []pinRow
	names := map[string]map[string]bool{}
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || strings.HasPrefix(f[0], "#") {
			continue
		}
		if len(f) != 5 || !sha256Re.MatchString(f[4]) || !strings.Contains(f[1], "@") {
			t.Fatalf("%s: row %q: want set, package@version, path, name, SHA-256", ortPins, line)
		}
		r := pinRow{f[0], f[1], f[2], f[3], f[4]}
		if names[r.set] == nil {
			names[r.set] = map[string]bool{}
		}
		if names[r.set][r.name] {
			t.Errorf("%s: set %s installs %s twice", ortPins, r.set, r.name)
		}
		names[r.set][r.name] = true
		rows = append(rows, r)
	}
	if len(names["cpu"]) != 1 || len(names["cuda"]) < 3 || len(names) != 2 {
		t.Errorf("%s: sets %v; want cpu (the core) and cuda (a core and the provider libraries) only", ortPins, names)
	}
	for _, set := range []string{"cpu", "cuda"} {
		core := false
		for _, r := range rows {
			if r.set == set && r.name == "libonnxruntime.so.1" {
				core = strings.HasPrefix(r.pkg, "onnxruntime-node@") && r.inner == "package/bin/napi-v6/linux/x64/libonnxruntime.so.1"
			}
		}
		if !core {
			t.Errorf("%s: set %s has no libonnxruntime.so.1 from onnxruntime-node's package/bin/napi-v6/linux/x64/", ortPins, set)
		}
	}
	return rows
}

// pinnedCoreVersion is the ORT release of a pin set's core.
func pinnedCoreVersion(t *testing.T, set string) string {
	t.Helper()
	for _, r := range readORTPins(t) {
		if r.set == set && r.name == "libonnxruntime.so.1" {
			_, v, _ := strings.Cut(r.pkg, "@")
			return v
		}
	}
	t.Fatalf("%s: no core in set %s", ortPins, set)
	return ""
}

// checkORTStage: a Dockerfile's ort stage installs its pin set into
// /opt/onnxruntime/lib with scripts/fetch-ort.sh (which verifies every file
// with sha256sum -c before installing any), and its ORT_VERSION, which names
// the image's release, is that set's core.
func checkORTStage(t *testing.T, path string, df dockerfile, set string) {
	t.Helper()
	var ort *stage
	for i := range df.stages {
		if df.stages[i].name == "ort" {
			ort = &df.stages[i]
		}
	}
	if ort == nil {
		t.Fatalf("%s: no ort stage", path)
	}
	var run, copies string
	for _, in := range ort.ins {
		switch in.cmd {
		case "RUN":
			run += in.args + "\n"
		case "COPY":
			copies += in.args + "\n"
		}
	}
	if !strings.Contains(copies, "deploy/ort/pins.txt") || !strings.Contains(copies, "scripts/fetch-ort.sh") ||
		!regexp.MustCompile(`fetch-ort\.sh --pins \S*pins\.txt `+set+` /opt/onnxruntime/lib\b`).MatchString(run) {
		t.Errorf("%s: the ort stage does not install the %s set of deploy/ort/pins.txt with scripts/fetch-ort.sh", path, set)
	}
	if script, err := os.ReadFile("../scripts/fetch-ort.sh"); err != nil || !regexp.MustCompile(`sha256sum (--strict )?(--quiet )?-c`).Match(script) {
		t.Errorf("scripts/fetch-ort.sh does not verify the ORT files with sha256sum -c (err %v)", err)
	}
	if v, want := df.globalArgs["ORT_VERSION"], pinnedCoreVersion(t, set); v != want {
		t.Errorf("%s: ORT_VERSION = %q, want %s, the %s core of %s", path, v, want, set, ortPins)
	}
}

func TestDockerfiles(t *testing.T) {
	d := readDesign(t)
	t.Run("cpu", func(t *testing.T) {
		df := parseDockerfile(t, cpuDockerfile)
		checkDockerfileCommon(t, cpuDockerfile, df)
		fin := df.final()
		env := fin.env()
		// The image fetches the cpu set with the Makefile's script, so both
		// get the same bytes by the same bounded, verified route.
		checkORTStage(t, cpuDockerfile, df, "cpu")
		mk, err := exec.Command("make", "-C", "..", "-s", "-n", "-p", "ort").Output()
		if err != nil {
			t.Fatalf("make -n -p ort: %v", err)
		}
		if m := regexp.MustCompile(`(?m)^ORT_VERSION := (\S+)$`).FindSubmatch(mk); m == nil || string(m[1]) != pinnedCoreVersion(t, "cpu") {
			t.Errorf("the Makefile's ORT_VERSION is %q, want the cpu core's %s from %s", m, pinnedCoreVersion(t, "cpu"), ortPins)
		}
		if !regexp.MustCompile(`(?m)^\t\./scripts/fetch-ort\.sh --pins \$\(ORT_PINS\) cpu `).Match(mk) {
			t.Error("make ort does not install the cpu set of ORT_PINS with scripts/fetch-ort.sh")
		}
		for k, want := range map[string]string{
			"ORT_LIB":   "/opt/onnxruntime/lib/libonnxruntime.so.1",
			"MODEL_DIR": "/models",
		} {
			if env[k] != want {
				t.Errorf("CPU image ENV %s = %q, want %q", k, env[k], want)
			}
		}
		for k := range env {
			if !d.vars[k] && !slices.Contains([]string{"ORT_VERSION", "HOME", "TMPDIR"}, k) {
				t.Errorf("CPU image ENV %s is not a documented variable", k)
			}
		}
		if base := df.expand(fin.from); !strings.HasPrefix(base, "debian:") || !strings.Contains(base, "slim") {
			t.Errorf("CPU runtime base = %q, want debian bookworm slim", base)
		}
		if build := df.expand(df.stages[0].from); !strings.HasPrefix(build, "golang:") || !strings.Contains(build, "bookworm") {
			t.Errorf("CPU build base = %q, want golang on bookworm", build)
		}
		checkEntrypoint(t, cpuDockerfile, fin, env)
	})
	t.Run("cuda", func(t *testing.T) {
		df := parseDockerfile(t, cudaDockerfile)
		checkDockerfileCommon(t, cudaDockerfile, df)
		fin := df.final()
		env := fin.env()
		if base := df.expand(fin.from); !strings.HasPrefix(base, "nvidia/cuda:") || !strings.Contains(base, "runtime") {
			t.Errorf("CUDA runtime base = %q, want an nvidia/cuda runtime image", base)
		}
		for k, want := range map[string]string{
			"ORT_LIB":           "/opt/onnxruntime/lib/libonnxruntime.so.1",
			"MODEL_DIR":         "/models",
			"DEVICE":            "auto",
			"CUDA_DEVICE_ORDER": "PCI_BUS_ID",
		} {
			if env[k] != want {
				t.Errorf("CUDA image ENV %s = %q, want %q", k, env[k], want)
			}
		}
		if env["NVIDIA_VISIBLE_DEVICES"] == "" {
			t.Error("CUDA image sets no NVIDIA_VISIBLE_DEVICES")
		}
		// The ORT files come from the one pin list, installed by the same script as `make
		// cuda-ort`, which checks every file's SHA-256 before installing any.
		checkORTStage(t, cudaDockerfile, df, "cuda")
		checkEntrypoint(t, cudaDockerfile, fin, env)
	})
	t.Run("connect", func(t *testing.T) {
		df := parseDockerfile(t, connectDocker)
		for _, st := range df.stages {
			if img := df.expand(st.from); !imagePinned(img) {
				t.Errorf("%s: FROM %q not pinned", connectDocker, img)
			}
		}
		raw, _ := os.ReadFile(connectDocker)
		if !strings.Contains(string(raw), "kafka-connect-jdbc") {
			t.Errorf("%s does not install the JDBC connector", connectDocker)
		}
	})
}

func checkEntrypoint(t *testing.T, path string, fin stage, env map[string]string) {
	t.Helper()
	if ep, _ := fin.last("ENTRYPOINT"); ep != `["scorer"]` {
		t.Errorf(`%s: ENTRYPOINT %s, want ["scorer"]`, path, ep)
	}
	if cmd, _ := fin.last("CMD"); cmd != `["run"]` {
		t.Errorf(`%s: CMD %s, want ["run"]`, path, cmd)
	}
	port := strings.TrimPrefix(env["METRICS_ADDR"], ":")
	if port == "" {
		port = "9464"
	}
	if exp, _ := fin.last("EXPOSE"); !strings.Contains(exp, port) {
		t.Errorf("%s: EXPOSE %q does not include the metrics port %s", path, exp, port)
	}
}

// ---- Helm ----

// helmBin returns the helm binary ($HELM or helm on PATH) or skips the calling (sub)test.
func helmBin(t *testing.T) string {
	t.Helper()
	return toolBin(t, "HELM", "helm", "the chart render checks",
		"install it with: GOBIN=/usr/local/bin go install helm.sh/helm/v3/cmd/helm@v3.22.0")
}

// toolBin returns the tool named by $envVar, else name on PATH, or skips the
// calling (sub)test saying which checks it skips and how to install the tool
// (`make test` installs every one, so CI never skips).
func toolBin(t *testing.T, envVar, name, checks, install string) string {
	t.Helper()
	if p := os.Getenv(envVar); p != "" {
		return p
	}
	p, err := exec.LookPath(name)
	if err != nil {
		t.Skipf("%s is not on PATH (and $%s is unset): skipping %s; %s", name, envVar, checks, install)
	}
	return p
}

func runHelm(t *testing.T, helm string, args ...string) (string, error) {
	t.Helper()
	home := t.TempDir()
	cmd := exec.Command(helm, args...)
	cmd.Env = append(os.Environ(),
		"HELM_CACHE_HOME="+filepath.Join(home, "cache"),
		"HELM_CONFIG_HOME="+filepath.Join(home, "config"),
		"HELM_DATA_HOME="+filepath.Join(home, "data"),
	)
	var out, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &stderr
	err := cmd.Run()
	if err != nil {
		return out.String() + stderr.String(), err
	}
	return out.String(), nil
}

type object = map[string]any

func parseManifests(t *testing.T, rendered string) map[string]object {
	t.Helper()
	byKind := map[string]object{}
	dec := yaml.NewDecoder(strings.NewReader(rendered))
	for {
		var o object
		err := dec.Decode(&o)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("parse rendered manifests: %v\n%s", err, rendered)
		}
		if o == nil {
			continue
		}
		kind, _ := o["kind"].(string)
		if _, dup := byKind[kind]; dup {
			t.Fatalf("two %s objects rendered; the test expects one of each kind", kind)
		}
		byKind[kind] = o
	}
	return byKind
}

// get walks nested maps/lists: keys are map keys or list indexes.
func get(v any, path ...any) any {
	for _, p := range path {
		switch k := p.(type) {
		case string:
			m, ok := v.(map[string]any)
			if !ok {
				return nil
			}
			v = m[k]
		case int:
			l, ok := v.([]any)
			if !ok || k >= len(l) {
				return nil
			}
			v = l[k]
		}
	}
	return v
}

func toInt(v any) int {
	switch n := v.(type) {
	case int:
		return n
	case float64:
		return int(n)
	case string:
		i, _ := strconv.Atoi(n)
		return i
	}
	return -1
}

func chartValues(t *testing.T) map[string]any {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(chartDir, "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var v map[string]any
	if err := yaml.Unmarshal(data, &v); err != nil {
		t.Fatal(err)
	}
	return v
}

func TestHelmChart(t *testing.T) {
	vars := configVars(t, readDesign(t))
	values := chartValues(t)
	inputPartitions := toInt(get(values, "kafka", "inputPartitions"))

	cases := []struct {
		name      string
		set       []string
		setString []string // --set-string (an EnvVar value must be a string)
		files     []string // -f values files
		gpu       string   // the GPU resource the pod asks for; "" = CPU
		keda      bool
		extra     func(t *testing.T, objs map[string]object)
	}{
		{name: "defaults", extra: func(t *testing.T, objs map[string]object) {
			checkGOMAXPROCS(t, objs, "")
			if objs["PersistentVolumeClaim"] != nil {
				t.Error("a PVC rendered without model.pvc.create")
			}
		}},
		{name: "gpu+keda", set: []string{"gpu.enabled=true", "keda.enabled=true", "kafka.rowsTopic=transcripts.scores.rows",
			"secret.env.EXTRA_SECRET=x", "metrics.serviceMonitor.enabled=true", "kafka.sasl.mechanism=SCRAM-SHA-512",
			"kafka.sasl.username=scorer", "kafka.sasl.password=pw", "kafka.tls.enabled=true", "kafka.tls.secretName=kafka-ca",
			"keda.authenticationRef=kafka-trigger-auth"},
			gpu: "nvidia.com/gpu", keda: true, extra: func(t *testing.T, objs map[string]object) {
				if ref := get(objs["ScaledObject"], "spec", "triggers", 0, "authenticationRef", "name"); ref != "kafka-trigger-auth" {
					t.Errorf("SASL/TLS with keda.authenticationRef, but the trigger's authenticationRef = %v", ref)
				}
				cm := configMapData(objs)
				if get(objs["Secret"], "stringData", "KAFKA_SASL_PASSWORD") != "pw" {
					t.Errorf("kafka.sasl.password set but the Secret = %v", objs["Secret"])
				}
				if cm["KAFKA_SASL_PASSWORD"] != nil {
					t.Error("the SASL password is in the ConfigMap")
				}
				if cm["KAFKA_TLS"] != "true" || cm["KAFKA_TLS_CA_FILE"] != "/etc/scorer/kafka-tls/ca.crt" {
					t.Errorf("kafka.tls set but ConfigMap KAFKA_TLS=%v KAFKA_TLS_CA_FILE=%v", cm["KAFKA_TLS"], cm["KAFKA_TLS_CA_FILE"])
				}
				if objs["ServiceMonitor"] == nil {
					t.Error("serviceMonitor enabled with the CRD known, but none rendered")
				}
				checkGOMAXPROCS(t, objs, "")
			}},
		// A MIG slice from the device plugin, as docs/operating.md tells: its own resource name, a node
		// selector for mixed-strategy nodes, DEVICE=cuda, and no CUDA_VISIBLE_DEVICES (which would
		// override the plugin's NVIDIA_VISIBLE_DEVICES=MIG-<uuid>).
		{name: "mig slice", files: []string{filepath.Join(chartDir, "ci", "mig-values.yaml")}, gpu: "nvidia.com/mig-1g.10gb",
			extra: func(t *testing.T, objs map[string]object) {
				pod := get(objs["Deployment"], "spec", "template", "spec")
				if toInt(get(pod, "containers", 0, "resources", "limits", "nvidia.com/mig-1g.10gb")) != 1 {
					t.Errorf("limits = %v, want one nvidia.com/mig-1g.10gb", get(pod, "containers", 0, "resources", "limits"))
				}
				if sel := get(pod, "nodeSelector"); get(sel, "nvidia.com/mig.strategy") != "mixed" || get(sel, "nvidia.com/gpu.present") != "true" {
					t.Errorf("nodeSelector = %v, want nvidia.com/mig.strategy=mixed on a GPU node", sel)
				}
				cm := configMapData(objs)
				for _, e := range toSlice(get(pod, "containers", 0, "env")) {
					if get(e, "name") == "CUDA_VISIBLE_DEVICES" {
						t.Errorf("env sets CUDA_VISIBLE_DEVICES: %v", e)
					}
				}
				if cm["CUDA_VISIBLE_DEVICES"] != nil || cm["CUDA_DEVICE_ORDER"] != "PCI_BUS_ID" {
					t.Errorf("ConfigMap CUDA_VISIBLE_DEVICES=%v CUDA_DEVICE_ORDER=%v, want unset and PCI_BUS_ID", cm["CUDA_VISIBLE_DEVICES"], cm["CUDA_DEVICE_ORDER"])
				}
			}},
		{name: "hostPath model, explicit grace", set: []string{"model.source=hostPath", "terminationGracePeriodSeconds=120", "shutdownTimeoutSeconds=60"}},
		{name: "created PVC, explicit GOMAXPROCS", set: []string{"model.pvc.create=true", "extraEnv[0].name=GOMAXPROCS"},
			setString: []string{"extraEnv[0].value=3"},
			extra: func(t *testing.T, objs map[string]object) {
				checkGOMAXPROCS(t, objs, "3")
				pvc := objs["PersistentVolumeClaim"]
				if pvc == nil {
					t.Fatal("model.pvc.create=true but no PVC rendered")
				}
				// A new, empty claim must be writable once to be filled; ReadOnlyMany cannot be.
				if modes := toStrings(get(pvc, "spec", "accessModes")); !slices.Equal(modes, []string{"ReadWriteMany"}) {
					t.Errorf("created PVC accessModes = %v, want [ReadWriteMany]", modes)
				}
				pod := get(objs["Deployment"], "spec", "template", "spec")
				for _, v := range toSlice(get(pod, "volumes")) {
					if get(v, "name") == "model" && (get(v, "persistentVolumeClaim", "claimName") != get(pvc, "metadata", "name") ||
						get(v, "persistentVolumeClaim", "readOnly") != true) {
						t.Errorf("model volume = %v, want the created claim, readOnly", v)
					}
				}
			}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			helm := helmBin(t)
			args := []string{"lint", "--strict", "--kube-version", kubeVersion, chartDir}
			for _, s := range tc.set {
				args = append(args, "--set", s)
			}
			for _, s := range tc.setString {
				args = append(args, "--set-string", s)
			}
			for _, f := range tc.files {
				args = append(args, "-f", f)
			}
			if out, err := runHelm(t, helm, args...); err != nil {
				t.Fatalf("helm lint: %v\n%s", err, out)
			}
			args = []string{"template", "scorer", chartDir, "--namespace", "scoring", "--kube-version", kubeVersion,
				"--api-versions", "monitoring.coreos.com/v1/ServiceMonitor"}
			for _, s := range tc.set {
				args = append(args, "--set", s)
			}
			for _, s := range tc.setString {
				args = append(args, "--set-string", s)
			}
			for _, f := range tc.files {
				args = append(args, "-f", f)
			}
			out, err := runHelm(t, helm, args...)
			if err != nil {
				t.Fatalf("helm template: %v\n%s", err, out)
			}
			objs := parseManifests(t, out)
			checkRendered(t, vars, objs, inputPartitions, tc.gpu, tc.keda)
			if tc.extra != nil {
				tc.extra(t, objs)
			}
		})
	}

	t.Run("guards", func(t *testing.T) {
		helm := helmBin(t)
		for _, g := range []struct {
			set  []string
			want string
		}{
			{[]string{"keda.enabled=true", "keda.maxReplicaCount=" + strconv.Itoa(inputPartitions+1)}, "must be <= kafka.inputPartitions"},
			{[]string{"terminationGracePeriodSeconds=10"}, "terminationGracePeriodSeconds (10) must be >="},
			{[]string{"config.SHUTDOWN_TIMEOUT=5s"}, "config.SHUTDOWN_TIMEOUT is set from other values"},
			{[]string{"kafka.brokers="}, "kafka.brokers is required"},
			{[]string{`kafka.brokers=\,`}, "kafka.brokers is required"},
			{[]string{"kafka.brokers=embedded"}, "kafka.brokers may not be embedded"},
			{[]string{`kafka.brokers=kafka:9092\,Embedded`}, "kafka.brokers may not be embedded"},
			// KEDA's scaler needs the brokers' credentials too, or it never reads the lag.
			{[]string{"keda.enabled=true", "kafka.sasl.mechanism=PLAIN", "kafka.sasl.username=u"}, "keda.authenticationRef is required when kafka.sasl/tls is set"},
			{[]string{"keda.enabled=true", "kafka.tls.enabled=true"}, "keda.authenticationRef is required when kafka.sasl/tls is set"},
		} {
			args := []string{"template", "scorer", chartDir, "--kube-version", kubeVersion}
			for _, s := range g.set {
				args = append(args, "--set", s)
			}
			out, err := runHelm(t, helm, args...)
			if err == nil || !strings.Contains(out, g.want) {
				t.Errorf("helm template --set %v: err=%v, want a failure containing %q; output:\n%s", g.set, err, g.want, out)
			}
		}
	})
}

// configVars returns the variables the binary reads: the reference's plus the env tags of
// internal/config/config.go (the reference is generated from them; a test in cmd/scorer keeps it so).
func configVars(t *testing.T, d design) map[string]bool {
	t.Helper()
	vars := maps.Clone(d.vars)
	src, err := os.ReadFile(cmdConfig)
	if err != nil {
		t.Logf("%s not readable (%v); checking against %s only", cmdConfig, err, configDoc)
		return vars
	}
	var undocumented []string
	for _, m := range envTagRe.FindAllSubmatch(src, -1) {
		if !vars[string(m[1])] {
			undocumented = append(undocumented, string(m[1]))
		}
		vars[string(m[1])] = true
	}
	if len(undocumented) > 0 {
		t.Errorf("read by %s but not in %s: %s (make docs)", cmdConfig, configDoc, strings.Join(undocumented, " "))
	}
	return vars
}

// checkRendered checks what every rendering must hold; gpuResource is the GPU resource the pod asks for
// ("" = a CPU pod).
func checkRendered(t *testing.T, vars map[string]bool, objs map[string]object, inputPartitions int, gpuResource string, keda bool) {
	t.Helper()
	gpu := gpuResource != ""
	for _, kind := range []string{"Deployment", "ConfigMap", "Service", "PodDisruptionBudget", "ServiceAccount"} {
		if objs[kind] == nil {
			t.Fatalf("no %s rendered", kind)
		}
	}
	cm := configMapData(objs)
	for k := range cm {
		if !vars[k] && k != "CUDA_DEVICE_ORDER" {
			t.Errorf("ConfigMap key %s is neither documented in %s nor read by %s", k, configDoc, cmdConfig)
		}
	}
	if cm["KAFKA_BROKERS"] == "" || cm["KAFKA_BROKERS"] == nil {
		t.Error("ConfigMap: KAFKA_BROKERS empty")
	}
	// A GPU pod runs DEVICE=cuda: without a working GPU its start fails with the doctor's diagnosis and
	// the pod restarts where everyone sees it, instead of crawling on the CPU.
	wantDevice := map[bool]string{false: "cpu", true: "cuda"}[gpu]
	if cm["DEVICE"] != wantDevice {
		t.Errorf("ConfigMap DEVICE = %v, want %s", cm["DEVICE"], wantDevice)
	}

	dep := objs["Deployment"]
	pod := get(dep, "spec", "template", "spec")
	psc := get(pod, "securityContext")
	if get(psc, "runAsNonRoot") != true || toInt(get(psc, "runAsUser")) != nonRootUID ||
		get(psc, "seccompProfile", "type") != "RuntimeDefault" {
		t.Errorf("pod securityContext = %v", psc)
	}
	ctr := get(pod, "containers", 0)
	for _, e := range toSlice(get(ctr, "env")) {
		// TMPDIR and GOMAXPROCS are not the scorer's configuration: TMPDIR is for ORT and Go's temp
		// files, GOMAXPROCS is a Go runtime variable the chart derives from the CPU request (the
		// scorer's WORKERS=0/CPU_THREADS=0 follow it).
		if name := toString(get(e, "name")); !vars[name] && name != "TMPDIR" && name != "GOMAXPROCS" {
			t.Errorf("container env %s is neither documented in %s nor read by %s", name, configDoc, cmdConfig)
		}
	}
	sc := get(ctr, "securityContext")
	if get(sc, "allowPrivilegeEscalation") != false || get(sc, "readOnlyRootFilesystem") != true ||
		get(sc, "runAsNonRoot") != true || toInt(get(sc, "runAsUser")) != nonRootUID ||
		!slices.Equal(toStrings(get(sc, "capabilities", "drop")), []string{"ALL"}) ||
		get(sc, "seccompProfile", "type") != "RuntimeDefault" {
		t.Errorf("container securityContext = %v", sc)
	}

	// /tmp is an emptyDir, the only writable mount.
	tmpVol := ""
	for _, m := range toSlice(get(ctr, "volumeMounts")) {
		if get(m, "mountPath") == "/tmp" {
			tmpVol, _ = get(m, "name").(string)
		} else if get(m, "readOnly") != true {
			t.Errorf("volume mount %v is writable", m)
		}
	}
	if tmpVol == "" || !slices.ContainsFunc(toSlice(get(pod, "volumes")), func(v any) bool {
		return get(v, "name") == tmpVol && get(v, "emptyDir") != nil
	}) {
		t.Error("no emptyDir mounted at /tmp")
	}

	// Probes on the metrics port.
	metricsPort := toInt(strings.TrimPrefix(toString(cm["METRICS_ADDR"]), ":"))
	portName := ""
	for _, p := range toSlice(get(ctr, "ports")) {
		if toInt(get(p, "containerPort")) == metricsPort {
			portName, _ = get(p, "name").(string)
		}
	}
	if portName == "" {
		t.Errorf("no container port for METRICS_ADDR %v", cm["METRICS_ADDR"])
	}
	for probe, path := range map[string]string{"livenessProbe": "/healthz", "readinessProbe": "/readyz"} {
		hg := get(ctr, probe, "httpGet")
		if get(hg, "path") != path || (get(hg, "port") != portName && toInt(get(hg, "port")) != metricsPort) {
			t.Errorf("%s = %v, want GET %s on the metrics port", probe, hg, path)
		}
	}

	// Grace period covers the drain.
	shutdown, err := time.ParseDuration(toString(cm["SHUTDOWN_TIMEOUT"]))
	if err != nil {
		t.Fatalf("ConfigMap SHUTDOWN_TIMEOUT %v: %v", cm["SHUTDOWN_TIMEOUT"], err)
	}
	grace := time.Duration(toInt(get(pod, "terminationGracePeriodSeconds"))) * time.Second
	if grace < shutdown+5*time.Second {
		t.Errorf("terminationGracePeriodSeconds %v < SHUTDOWN_TIMEOUT %v + 5s margin", grace, shutdown)
	}

	limits, _ := get(ctr, "resources", "limits").(map[string]any)
	image := toString(get(ctr, "image"))
	if gpu {
		if toInt(limits[gpuResource]) < 1 {
			t.Errorf("gpu.enabled but limits = %v, want %s", limits, gpuResource)
		}
		if get(pod, "nodeSelector") == nil || get(pod, "tolerations") == nil {
			t.Error("gpu.enabled but no nodeSelector/tolerations")
		}
		if !strings.Contains(image, "cuda") {
			t.Errorf("gpu.enabled but image %s is not the CUDA image", image)
		}
	} else if _, ok := limits["nvidia.com/gpu"]; ok {
		t.Error("GPU limit without gpu.enabled")
	}
	for k := range limits {
		if strings.HasPrefix(k, "nvidia.com/") && k != gpuResource {
			t.Errorf("limits ask for %s too: %v", k, limits)
		}
	}
	so := objs["ScaledObject"]
	if keda {
		if so == nil {
			t.Fatal("keda.enabled but no ScaledObject")
		}
		if get(dep, "spec", "replicas") != nil {
			t.Error("keda.enabled but the Deployment sets replicas (KEDA owns them)")
		}
		if maxR := toInt(get(so, "spec", "maxReplicaCount")); maxR < 1 || maxR > inputPartitions {
			t.Errorf("ScaledObject maxReplicaCount %d not in [1, inputPartitions=%d]", maxR, inputPartitions)
		}
		trig := get(so, "spec", "triggers", 0)
		md := get(trig, "metadata")
		if get(trig, "type") != "kafka" || get(md, "consumerGroup") != cm["KAFKA_GROUP_ID"] ||
			get(md, "topic") != cm["KAFKA_INPUT_TOPIC"] || get(md, "bootstrapServers") != cm["KAFKA_BROKERS"] ||
			get(md, "lagThreshold") == nil {
			t.Errorf("ScaledObject trigger = %v, want kafka on group %v topic %v", trig, cm["KAFKA_GROUP_ID"], cm["KAFKA_INPUT_TOPIC"])
		}
		if get(so, "spec", "scaleTargetRef", "name") != get(dep, "metadata", "name") {
			t.Error("ScaledObject does not target the Deployment")
		}
	} else if so != nil {
		t.Error("ScaledObject rendered without keda.enabled")
	}
}

// checkGOMAXPROCS asserts the container sets GOMAXPROCS exactly once: from requests.cpu in whole
// cores (explicit == ""), or to the explicit extraEnv value.
func checkGOMAXPROCS(t *testing.T, objs map[string]object, explicit string) {
	t.Helper()
	var found []any
	for _, e := range toSlice(get(objs["Deployment"], "spec", "template", "spec", "containers", 0, "env")) {
		if get(e, "name") == "GOMAXPROCS" {
			found = append(found, e)
		}
	}
	if len(found) != 1 {
		t.Fatalf("container env has %d GOMAXPROCS entries, want 1: %v", len(found), found)
	}
	e := found[0]
	if explicit != "" {
		if get(e, "value") != explicit || get(e, "valueFrom") != nil {
			t.Errorf("GOMAXPROCS = %v, want the explicit value %q", e, explicit)
		}
		return
	}
	ref := get(e, "valueFrom", "resourceFieldRef")
	if get(ref, "resource") != "requests.cpu" || toString(get(ref, "divisor")) != "1" {
		t.Errorf("GOMAXPROCS = %v, want valueFrom.resourceFieldRef {resource: requests.cpu, divisor: \"1\"}", e)
	}
}

func toSlice(v any) []any { s, _ := v.([]any); return s }

func toString(v any) string {
	if s, ok := v.(string); ok {
		return s
	}
	return ""
}

func toStrings(v any) []string {
	var out []string
	for _, x := range toSlice(v) {
		out = append(out, toString(x))
	}
	return out
}
