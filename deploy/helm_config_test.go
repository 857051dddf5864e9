package deploy

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

var (
	reservedDictRe = regexp.MustCompile(`(?s)\$reserved := dict(.*?)\}\}`)
	reservedKeyRe  = regexp.MustCompile(`"([A-Z][A-Z0-9_]*)" "`)
	envNameRe      = regexp.MustCompile(`\b[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+\b|\bDEVICE\b`)
	envTagRe       = regexp.MustCompile(`env:"([A-Z][A-Z0-9_]*)"`)
)

// TestHelmConfigKeys keeps the chart's `config` honest: the keys the templates reserve (set from other
// values) are exactly the ones values.yaml's comment says are, every key the ConfigMap or Secret
// derives from other values is reserved or one config may override, each reserved key in config fails
// the render, and every other setting the scorer reads (the Kafka ones with no value of their own
// above all: KAFKA_SESSION_TIMEOUT, KAFKA_REBALANCE_TIMEOUT, KAFKA_CREATE_TOPICS) renders from config
// exactly once, with config's value.
func TestHelmConfigKeys(t *testing.T) {
	helm := helmBin(t)
	reserved := templateReserved(t)
	inComment, settable := valuesConfigComment(t)
	if !slices.Equal(slices.Sorted(slices.Values(inComment)), slices.Sorted(slices.Values(reserved))) {
		t.Errorf("values.yaml says these keys are set from other values:\n  %v\nthe templates reserve:\n  %v", inComment, reserved)
	}
	for _, k := range []string{"KAFKA_SESSION_TIMEOUT", "KAFKA_REBALANCE_TIMEOUT", "KAFKA_CREATE_TOPICS"} {
		if !slices.Contains(settable, k) {
			t.Errorf("values.yaml's comment does not say %s is set in config", k)
		}
	}

	// Everything that derives a key switched on, config left as values.yaml has it.
	full := []string{"gpu.enabled=true", "kafka.rowsTopic=rows", "kafka.sasl.mechanism=PLAIN", "kafka.sasl.username=u",
		"kafka.sasl.password=p", "kafka.tls.enabled=true", "kafka.tls.insecureSkipVerify=true", "kafka.tls.secretName=tls",
		"kafka.tls.certKey=tls.crt", "kafka.tls.keyKey=tls.key", "keda.authenticationRef=a"}
	objs := renderChart(t, helm, full, nil)
	defaults, _ := chartValues(t)["config"].(map[string]any)
	overridable := []string{"DEVICE", "CUDA_DEVICE_ORDER"}
	derived := map[string]bool{}
	for k := range configMapData(objs) {
		derived[k] = true
	}
	for k := range secretData(objs) {
		derived[k] = true
	}
	for k := range derived {
		if _, fromConfig := defaults[k]; !fromConfig && !slices.Contains(reserved, k) && !slices.Contains(overridable, k) {
			t.Errorf("%s is rendered from other values but not reserved: config.%s would render it twice", k, k)
		}
	}
	for _, k := range reserved {
		args := []string{"template", "scorer", chartDir, "--kube-version", kubeVersion, "--set", "config." + k + "=x"}
		if out, err := runHelm(t, helm, args...); err == nil || !strings.Contains(out, "config."+k+" is set from other values") {
			t.Errorf("config.%s: err=%v, want the render to fail naming it; output:\n%s", k, err, tail([]byte(out), 500))
		}
	}

	// Every setting the binary reads that is not reserved, plus the derived ones config may override,
	// set in config at once: each renders once, with config's value.
	want := map[string]string{"KAFKA_SESSION_TIMEOUT": "45s", "KAFKA_REBALANCE_TIMEOUT": "60s", "KAFKA_CREATE_TOPICS": "false",
		"DEVICE": "cuda", "CUDA_DEVICE_ORDER": "FASTEST_FIRST"}
	src, err := os.ReadFile(cmdConfig)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range envTagRe.FindAllSubmatch(src, -1) {
		if k := string(m[1]); !slices.Contains(reserved, k) && want[k] == "" {
			want[k] = "v-" + strings.ToLower(k)
		}
	}
	for _, k := range settable {
		if slices.Contains(reserved, k) {
			t.Errorf("values.yaml's comment says %s is set in config, but the templates reserve it", k)
		} else if _, ok := want[k]; !ok {
			t.Errorf("values.yaml's comment names %s, which the scorer does not read", k)
		}
	}
	b, err := yaml.Marshal(map[string]any{"config": want})
	if err != nil {
		t.Fatal(err)
	}
	vf := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(vf, b, 0o644); err != nil {
		t.Fatal(err)
	}
	cm := configMapData(renderChart(t, helm, full, []string{vf})) // a key rendered twice fails the YAML parse
	for k, v := range want {
		if got := cm[k]; got != v {
			t.Errorf("config.%s=%q renders as %v", k, v, got)
		}
	}
	t.Logf("%d reserved keys, %d keys rendered from config", len(reserved), len(want))
}

// templateReserved returns the keys _helpers.tpl's $reserved dict holds.
func templateReserved(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(chartDir, "templates", "_helpers.tpl"))
	if err != nil {
		t.Fatal(err)
	}
	m := reservedDictRe.FindSubmatch(b)
	if m == nil {
		t.Fatal("_helpers.tpl has no `$reserved := dict …`")
	}
	var keys []string
	for _, k := range reservedKeyRe.FindAllSubmatch(m[1], -1) {
		keys = append(keys, string(k[1]))
	}
	if len(keys) < 10 {
		t.Fatalf("_helpers.tpl's $reserved parsed to %v", keys)
	}
	return keys
}

// valuesConfigComment reads the comment above values.yaml's `config:`: the keys it says are set from
// other values (after "repeated here:") and those it says belong in config (after "this is where they
// go:").
func valuesConfigComment(t *testing.T) (reserved, settable []string) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(chartDir, "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(b), "\n")
	i := slices.Index(lines, "config:")
	if i < 0 {
		t.Fatal("values.yaml has no top-level config:")
	}
	var comment []string
	for j := i - 1; j >= 0 && strings.HasPrefix(lines[j], "#"); j-- {
		comment = append([]string{strings.TrimSpace(strings.TrimPrefix(lines[j], "#"))}, comment...)
	}
	text := strings.Join(comment, " ")
	_, after, ok1 := strings.Cut(text, "repeated here:")
	res, set, ok2 := strings.Cut(after, "this is where they go:")
	if !ok1 || !ok2 {
		t.Fatalf("the comment above values.yaml's config: does not say which keys are set from other values (\"repeated here: …\") and which go in config (\"this is where they go: …\"):\n%s", text)
	}
	return envNameRe.FindAllString(res, -1), envNameRe.FindAllString(set, -1)
}

// renderChart runs helm template with --set values and values files and parses the result.
func renderChart(t *testing.T, helm string, set, files []string) map[string]object {
	t.Helper()
	args := []string{"template", "scorer", chartDir, "--namespace", "scoring", "--kube-version", kubeVersion}
	for _, s := range set {
		args = append(args, "--set", s)
	}
	for _, f := range files {
		args = append(args, "-f", f)
	}
	out, err := runHelm(t, helm, args...)
	if err != nil {
		t.Fatalf("helm template %v: %v\n%s", set, err, out)
	}
	return parseManifests(t, out)
}

func configMapData(objs map[string]object) map[string]any {
	m, _ := get(objs["ConfigMap"], "data").(map[string]any)
	return m
}

// secretData is the chart's Secret's keys (stringData or data).
func secretData(objs map[string]object) map[string]any {
	out := map[string]any{}
	for _, field := range []string{"stringData", "data"} {
		if m, ok := get(objs["Secret"], field).(map[string]any); ok {
			for k, v := range m {
				out[k] = fmt.Sprint(v)
			}
		}
	}
	return out
}
