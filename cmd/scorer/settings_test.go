package main

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/scorer/scorer/internal/testenv"
)

// TestSubcommandsBuildTheSameScorer: from one environment, `scorer run`,
// `score`, `bench` (its pipeline section, the service's own wiring) and
// `doctor` (its CPU sample) build the same scorer: batch shape, workers,
// session settings and CPU memory budget, and all but the doctor, which
// decodes no input and so reads no input limits, the same limits. Each
// logs the settings its pool was built with ("scorer built", debug level);
// the environment sets every one of them away from its default, so a
// subcommand that built its own from a few fields, or from defaults, shows
// here.
func TestSubcommandsBuildTheSameScorer(t *testing.T) {
	if testing.Short() {
		t.Skip("starts run, score, bench's pipeline and the doctor's CPU sample on a real model, minutes on two busy cores; make test runs it")
	}
	env := withEnv(testenv.ScorerEnv(t), "MODEL_DIR", testenv.ModelDir(t, "nli-unigram-small"), "LOG_LEVEL", "debug",
		"DEVICE", "cpu", "MAX_BATCH_ROWS", "200", "MAX_BATCH_TOKENS", "20000", "CPU_MAX_BATCH_ROWS", "12", "CPU_MAX_BATCH_TOKENS", "4096",
		"WORKERS", "2", "CPU_THREADS", "1", "GPU_MEM_FRACTION", "0.7", "GPU_MEM_LIMIT", "0.4", "GPU_TF32", "true",
		"CPU_MEM_LIMIT", "3GiB", "CPU_MAX_BATCH_BYTES", "300MiB", "SCORE_CACHE_BYTES", "1048576", "BATCH_MAX_BYTES", "4194304",
		"MAX_MESSAGE_BYTES", "4194304", "MAX_SENTENCES", "5000", "MAX_SENTENCE_BYTES", "65536")
	dir := t.TempDir()
	in := filepath.Join(dir, "in.jsonl")
	if err := os.WriteFile(in, firstLines(t, testenv.Transcripts(t), 1), 0o644); err != nil {
		t.Fatal(err)
	}

	built := map[string]map[string]any{}
	// run: in-process on its own in-memory broker, stopped once built.
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	runEnv := withEnv(env, "KAFKA_BROKERS", "embedded")
	logs := &testenv.LockedBuffer{}
	errc := make(chan error, 1)
	go func() {
		errc <- run(ctx, []string{"run", "--broker-addr", "127.0.0.1:0"}, func(k string) string { return runEnv[k] }, strings.NewReader(""), io.Discard, logs)
	}()
	waitUntil(t, 2*time.Minute, "scorer run to build its scorer", func() bool { return builtLine(logs.String()) != nil }, nil)
	cancel()
	if err := <-errc; err != nil {
		t.Fatalf("run: %v\n%s", err, testenv.Tail(logs.String(), 3000))
	}
	built["run"] = builtLine(logs.String())

	for _, args := range [][]string{{"score", "--in", in, "--out", filepath.Join(dir, "out.jsonl")}, {"doctor", "--duration", "100ms"}} {
		_, stderr, err := runCLI(t, env, "", args...)
		if err != nil {
			t.Fatalf("%s: %v\n%s", args[0], err, testenv.Tail(stderr, 3000))
		}
		built[args[0]] = builtLine(stderr)
	}

	// bench: its children are the binary re-run, so it runs as the binary.
	cmd := exec.Command(scorerBinary(t), "bench", "--model-dirs", env["MODEL_DIR"], "--transcripts", in, "--transcripts-limit", "1",
		"--skip", "latency,memory,scaling,shapes,revision,int8,large,wholeproc,production")
	cmd.Env = environ(env)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("bench: %v\n%s", err, testenv.Tail(string(out), 3000))
	}
	built["bench"] = builtLine(string(out))

	want := map[string]any{"devices": []any{"cpu"}, "workers": map[string]any{"cpu": 2.0}, "max_batch_tokens": 4096.0, "max_batch_rows": 12.0,
		"intra_op_threads": 1.0, "gpu_mem_fraction": 0.7, "gpu_mem_limit": "0.4", "gpu_tf32": true,
		"cpu_mem_limit": float64(3 << 30), "cpu_mem_reserve": float64(1<<20 + 2*2*4<<20 + (3<<30)/10), "cpu_max_batch_bytes": float64(300 << 20),
		"max_message_bytes": 4194304.0, "max_sentences": 5000.0, "max_sentence_bytes": 65536.0}
	for name, got := range built {
		if got == nil {
			t.Errorf("%s logged no \"scorer built\" line", name)
			continue
		}
		for k, v := range want {
			if name == "doctor" && strings.HasPrefix(k, "max_sentence") || name == "doctor" && k == "max_message_bytes" {
				continue
			}
			if !reflect.DeepEqual(got[k], v) {
				t.Errorf("%s built %s = %v, want %v (as every subcommand, from the environment)", name, k, got[k], v)
			}
		}
	}
}

// builtLine is the first "scorer built" log line in logs, decoded; nil when
// there is none.
func builtLine(logs string) map[string]any {
	sc := bufio.NewScanner(strings.NewReader(logs))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var m map[string]any
		if json.Unmarshal(sc.Bytes(), &m) == nil && m["message"] == "scorer built" {
			return m
		}
	}
	return nil
}

// firstLines is the first n lines of the file at path.
func firstLines(t *testing.T, path string, n int) []byte {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []byte
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for i := 0; i < n && sc.Scan(); i++ {
		out = append(append(out, sc.Bytes()...), '\n')
	}
	return out
}
