package config

import (
	"flag"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/scorer/scorer/internal/testenv"
)

func parseConfig(t *testing.T, environ map[string]string, args ...string) (Config, error) {
	t.Helper()
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	return Load(All, func(k string) string { return environ[k] }, fs, args)
}

func TestConfigDefaults(t *testing.T) {
	cfg, err := parseConfig(t, nil)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.InputTopic != "transcripts" || cfg.OutputTopic != "transcripts.scored" || cfg.DLQTopic != "transcripts.dlq" {
		t.Errorf("topics = %q %q %q", cfg.InputTopic, cfg.OutputTopic, cfg.DLQTopic)
	}
	if len(cfg.KafkaBrokers) != 0 {
		t.Errorf("KafkaBrokers = %v, want empty (scorer run refuses it)", cfg.KafkaBrokers)
	}
	want := []string{"consumer strength", "consumer weakness", "reduced consumer's spending patterns"}
	if !reflect.DeepEqual(cfg.Labels, want) {
		t.Errorf("Labels = %q, want %q", cfg.Labels, want)
	}
	if cfg.Threshold != 0.91 || cfg.HypothesisTemplate != "This text is about {}." {
		t.Errorf("threshold %v template %q", cfg.Threshold, cfg.HypothesisTemplate)
	}
	if cfg.BatchMaxWait != 200*time.Millisecond || cfg.ShutdownTimeout != 30*time.Second {
		t.Errorf("durations %v %v", cfg.BatchMaxWait, cfg.ShutdownTimeout)
	}
}

func TestConfigFlagsOverrideEnvironment(t *testing.T) {
	cfg, err := parseConfig(t, map[string]string{"KAFKA_BROKERS": "a:1,b:2", "THRESHOLD": "0.5", "LABELS": "x,y"},
		"--threshold", "0.7", "--batch-max-wait", "1s", "--gpu-ids", "0,GPU-abc", "--kafka-tls")
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(cfg.KafkaBrokers, []string{"a:1", "b:2"}) {
		t.Errorf("brokers from env = %v", cfg.KafkaBrokers)
	}
	if cfg.Threshold != 0.7 {
		t.Errorf("flag did not override env: threshold %v", cfg.Threshold)
	}
	if !reflect.DeepEqual(cfg.Labels, []string{"x", "y"}) || cfg.BatchMaxWait != time.Second || !cfg.KafkaTLS {
		t.Errorf("labels %q wait %v tls %v", cfg.Labels, cfg.BatchMaxWait, cfg.KafkaTLS)
	}
	if !reflect.DeepEqual(cfg.GPUIDs, []string{"0", "GPU-abc"}) {
		t.Errorf("gpu ids %q", cfg.GPUIDs)
	}
}

func TestConfigValidation(t *testing.T) {
	for name, tc := range map[string]struct {
		env  map[string]string
		want string
	}{
		"template without braces": {map[string]string{"HYPOTHESIS_TEMPLATE": "About this."}, "HYPOTHESIS_TEMPLATE"},
		"template with two":       {map[string]string{"HYPOTHESIS_TEMPLATE": "{} and {}"}, "HYPOTHESIS_TEMPLATE"},
		"format":                  {map[string]string{"OUTPUT_FORMAT": "avro"}, "OUTPUT_FORMAT"},
		"device":                  {map[string]string{"DEVICE": "tpu"}, "DEVICE"},
		"fraction":                {map[string]string{"GPU_MEM_FRACTION": "1.5"}, "GPU_MEM_FRACTION"},
		"batch":                   {map[string]string{"BATCH_MAX_MESSAGES": "0"}, "BATCH_MAX_MESSAGES"},
		"sasl":                    {map[string]string{"KAFKA_SASL_MECHANISM": "GSSAPI"}, "KAFKA_SASL_MECHANISM"},
		"bad int":                 {map[string]string{"MAX_BATCH_ROWS": "many"}, "MAX_BATCH_ROWS"},
		"threshold above 1":       {map[string]string{"THRESHOLD": "91"}, "THRESHOLD"},
		"threshold negative":      {map[string]string{"THRESHOLD": "-0.1"}, "THRESHOLD"},
		"threshold NaN":           {map[string]string{"THRESHOLD": "NaN"}, "THRESHOLD"},
		"entailment index -2":     {map[string]string{"ENTAILMENT_INDEX": "-2"}, "ENTAILMENT_INDEX"},
		"labels only commas":      {map[string]string{"LABELS": " , ,"}, "LABELS"},
		"pair encoding":           {map[string]string{"PAIR_ENCODING": "concatenated"}, "PAIR_ENCODING"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := parseConfig(t, tc.env)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want one naming %s", err, tc.want)
			}
		})
	}
}

// TestConfigRangesAccepted is the other side of the range checks: the
// bounds themselves and -1 ("from id2label") are valid.
func TestConfigRangesAccepted(t *testing.T) {
	for _, env := range []map[string]string{
		{"THRESHOLD": "0"}, {"THRESHOLD": "1"}, {"ENTAILMENT_INDEX": "-1"}, {"ENTAILMENT_INDEX": "0"}, {"ENTAILMENT_INDEX": "2"},
		{"KAFKA_TLS": "true", "KAFKA_TLS_INSECURE_SKIP_VERIFY": "true"},
		{"KAFKA_TLS": "true", "KAFKA_TLS_CA_FILE": "ca.pem", "KAFKA_TLS_CERT_FILE": "c.pem", "KAFKA_TLS_KEY_FILE": "c.key"},
	} {
		if _, err := parseConfig(t, env); err != nil {
			t.Errorf("%v: %v", env, err)
		}
	}
}

// TestConfigTLSSettingsNeedKafkaTLS: a TLS setting without KAFKA_TLS=true
// would connect in plaintext and retry forever, so it is a config error
// that names the settings and the fix, from the environment or flags.
func TestConfigTLSSettingsNeedKafkaTLS(t *testing.T) {
	for name, tc := range map[string]struct {
		env  map[string]string
		args []string
		want []string
	}{
		"insecure":          {env: map[string]string{"KAFKA_TLS_INSECURE_SKIP_VERIFY": "true"}, want: []string{"KAFKA_TLS_INSECURE_SKIP_VERIFY"}},
		"ca file":           {env: map[string]string{"KAFKA_TLS_CA_FILE": "ca.pem"}, want: []string{"KAFKA_TLS_CA_FILE"}},
		"client cert":       {env: map[string]string{"KAFKA_TLS_CERT_FILE": "c.pem", "KAFKA_TLS_KEY_FILE": "c.key"}, want: []string{"KAFKA_TLS_CERT_FILE", "KAFKA_TLS_KEY_FILE"}},
		"flag":              {args: []string{"--kafka-tls-insecure-skip-verify"}, want: []string{"KAFKA_TLS_INSECURE_SKIP_VERIFY"}},
		"flag turns it off": {env: map[string]string{"KAFKA_TLS": "true", "KAFKA_TLS_CA_FILE": "ca.pem"}, args: []string{"--kafka-tls=false"}, want: []string{"KAFKA_TLS_CA_FILE"}},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := parseConfig(t, tc.env, tc.args...)
			if err == nil {
				t.Fatal("accepted")
			}
			for _, w := range append(tc.want, "set KAFKA_TLS=true") {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("err = %v, want it to name %s", err, w)
				}
			}
		})
	}
}

// TestConfigListsTrimmed: a list variable reads the same from the
// environment as from its flag, every element trimmed and empty ones
// dropped, so "a, b" never yields the label " b" (which would show in
// outputs and row keys) or the broker " k2:9092".
func TestConfigListsTrimmed(t *testing.T) {
	raw := map[string]string{
		"LABELS":        " consumer strength, consumer weakness ,,",
		"KAFKA_BROKERS": "k1:9092, k2:9092",
		"GPU_IDS":       "0 , GPU-abc",
	}
	want := Config{Labels: []string{"consumer strength", "consumer weakness"}, KafkaBrokers: []string{"k1:9092", "k2:9092"}, GPUIDs: []string{"0", "GPU-abc"}}
	fromEnv, err := parseConfig(t, raw)
	if err != nil {
		t.Fatal(err)
	}
	var args []string
	for k, v := range raw {
		args = append(args, "--"+flagName(k), v)
	}
	fromFlags, err := parseConfig(t, nil, args...)
	if err != nil {
		t.Fatal(err)
	}
	for src, got := range map[string]Config{"env": fromEnv, "flags": fromFlags} {
		if !reflect.DeepEqual(got.Labels, want.Labels) || !reflect.DeepEqual(got.KafkaBrokers, want.KafkaBrokers) || !reflect.DeepEqual(got.GPUIDs, want.GPUIDs) {
			t.Errorf("from %s: labels %q brokers %q gpu ids %q, want %q %q %q", src, got.Labels, got.KafkaBrokers, got.GPUIDs, want.Labels, want.KafkaBrokers, want.GPUIDs)
		}
	}
}

// TestTagsAreEnforced: what the reference says a setting may be (its enum
// and min tags) is what Validate accepts: every listed value and the least
// one pass, anything else fails naming the variable.
func TestTagsAreEnforced(t *testing.T) {
	ft := reflect.TypeFor[Config]()
	n := 0
	for i := range ft.NumField() {
		f := ft.Field(i)
		name := f.Tag.Get("env")
		var good, bad []string
		if e := f.Tag.Get("enum"); e != "" {
			good, bad = strings.Split(e, ","), []string{"bogus", ""}
		}
		if m := f.Tag.Get("min"); m != "" {
			if f.Type == reflect.TypeFor[time.Duration]() {
				d, _ := time.ParseDuration(m)
				good, bad = []string{m, (d + time.Second).String()}, []string{(d - time.Nanosecond).String()}
			} else {
				least, _ := strconv.Atoi(m)
				good, bad = []string{m, strconv.Itoa(least + 7)}, []string{strconv.Itoa(least - 1)}
			}
		}
		for _, v := range good {
			if _, err := parseConfig(t, nil, "--"+flagName(name)+"="+v); err != nil {
				t.Errorf("%s=%q refused: %v", name, v, err)
			}
		}
		for _, v := range bad {
			n++
			if _, err := parseConfig(t, nil, "--"+flagName(name)+"="+v); err == nil || !strings.Contains(err.Error(), name) {
				t.Errorf("%s=%q: err = %v, want one naming %s", name, v, err, name)
			}
		}
	}
	if n < 20 {
		t.Errorf("only %d refusals tried; the tags are not being read", n)
	}
}

func TestSecretsAreRedactedInFlagDefaults(t *testing.T) {
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	_, err := Load(All, func(k string) string {
		if k == "KAFKA_SASL_PASSWORD" {
			return "hunter2"
		}
		return ""
	}, fs, nil)
	if err != nil {
		t.Fatal(err)
	}
	var usage strings.Builder
	fs.SetOutput(&usage)
	fs.PrintDefaults()
	if strings.Contains(usage.String(), "hunter2") {
		t.Fatal("the SASL password shows in the flag usage")
	}
}

func TestCPUPlanSplitsCores(t *testing.T) {
	const n = 6
	for _, tc := range []struct {
		workers, threads         int
		wantWorkers, wantThreads int
	}{
		{0, 0, min(n, 4), max(1, n/min(n, 4))},
		{0, 1, n, 1},
		{1, 0, 1, n},
		{3, 5, 3, 5},
	} {
		c := Config{Workers: tc.workers, CPUThreads: tc.threads}
		w, th := c.CPUPlan(Host{Cores: n})
		if w != tc.wantWorkers || th != tc.wantThreads {
			t.Errorf("CPUPlan(WORKERS=%d, CPU_THREADS=%d) = %d workers × %d threads, want %d × %d",
				tc.workers, tc.threads, w, th, tc.wantWorkers, tc.wantThreads)
		}
	}
}

// TestDefaultORTLibIgnoresWorkingDirectory: with ORT_LIB unset the library
// is looked for beside the executable's folder only. A library planted at
// the default's relative path under the working directory (a checkout, a
// download folder) is never the one resolved, since loading it runs its
// code.
func TestDefaultORTLibIgnoresWorkingDirectory(t *testing.T) {
	// The default names the core of the pin list's cpu set, where `make ort`
	// puts it.
	if want, err := filepath.Rel(testenv.RepoRoot(), testenv.DefaultORTLib()); err != nil || want != defaultORTLib {
		t.Errorf("defaultORTLib %q, want %q from deploy/ort/pins.txt (%v)", defaultORTLib, want, err)
	}
	dir := t.TempDir()
	planted := filepath.Join(dir, defaultORTLib)
	if err := os.MkdirAll(filepath.Dir(planted), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(planted, []byte("not onnxruntime"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Chdir(dir)
	cfg, err := parseConfig(t, nil)
	if err != nil {
		t.Fatal(err)
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(filepath.Dir(exe), "..", ".deps"); !filepath.IsAbs(cfg.ORTLib) || !strings.HasPrefix(cfg.ORTLib, want+string(filepath.Separator)) {
		t.Errorf("default ORT_LIB = %q, want an absolute path under %s", cfg.ORTLib, want)
	}
	if lib, err := ResolvePath(cfg.ORTLib); err == nil {
		if sameFile(lib, planted) {
			t.Fatalf("the default ORT_LIB resolved to %s, the working directory's planted file", lib)
		}
	}
}

// TestConfigModelFileStaysInModelDir: MODEL_FILE names a graph inside
// MODEL_DIR; a path that leaves it is refused, naming the variable.
func TestConfigModelFileStaysInModelDir(t *testing.T) {
	for _, bad := range []string{"../other/model.onnx", "onnx/../../model.onnx", "/etc/model.onnx"} {
		_, err := parseConfig(t, map[string]string{"MODEL_FILE": bad})
		if err == nil || !strings.Contains(err.Error(), "MODEL_FILE") || !strings.Contains(err.Error(), "MODEL_DIR") {
			t.Errorf("MODEL_FILE=%s: err = %v, want one naming MODEL_FILE and MODEL_DIR", bad, err)
		}
	}
	for _, good := range []string{"model.onnx", "onnx/model_quantized.onnx", "./onnx/../model.onnx"} {
		if _, err := parseConfig(t, map[string]string{"MODEL_FILE": good}); err != nil {
			t.Errorf("MODEL_FILE=%s: %v", good, err)
		}
	}
}
