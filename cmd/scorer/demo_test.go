package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/scorer/scorer/internal/testenv"
)

// TestDemoSummaryWithBadAndRepeatedLines: a --demo-file with a line that
// is not an event and a call sent twice still gets its summary, once every
// produced record is handled (scored or dead-lettered), counting the two
// distinct calls, and says what the model is (every shared model is a test
// stand-in). `make run` takes this path with MODEL_DIR, so it runs on every
// model folder.
func TestDemoSummaryWithBadAndRepeatedLines(t *testing.T) {
	file := filepath.Join(t.TempDir(), "demo.jsonl")
	a := `{"call_id":"DEMO-A","sections":{"FILT_MD":["Consumers kept spending on travel.","Margins were stable."]}}`
	b := `{"call_id":"DEMO-B","sections":{"FILT_MD":["Shoppers traded down to private label."]}}`
	if err := os.WriteFile(file, []byte(a+"\n"+b+"\nnot an event\n"+a+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, dir := range testenv.ModelDirs(t) {
		t.Run(filepath.Base(dir), func(t *testing.T) {
			env := withEnv(testenv.ScorerEnv(t), "MODEL_DIR", dir, "LABELS", "consumer weakness", "KAFKA_INPUT_PARTITIONS", "2", "KAFKA_BROKERS", "embedded")
			ctx, cancel := context.WithCancel(t.Context())
			out, logs := &testenv.LockedBuffer{}, &testenv.LockedBuffer{}
			errc := make(chan error, 1)
			go func() {
				errc <- run(ctx, []string{"run", "--demo-file", file, "--broker-addr", "127.0.0.1:0"},
					func(k string) string { return env[k] }, strings.NewReader(""), out, logs)
			}()
			t.Cleanup(func() {
				cancel()
				select {
				case <-errc:
				case <-time.After(30 * time.Second):
					t.Error("scorer did not stop within 30s")
				}
				if t.Failed() {
					t.Logf("scorer log:\n%s", testenv.Tail(logs.String(), 4000))
				}
			})
			waitUntil(t, 2*time.Minute, "the demo summary", func() bool { return strings.Contains(out.String(), "=== scorer demo summary ===") },
				func() string { return testenv.Tail(logs.String(), 1500) })
			if !strings.Contains(out.String(), "transcripts  2\n") || !strings.Contains(out.String(), "pairs        3 ") {
				t.Errorf("summary does not count the 2 distinct calls and their 3 pairs once each:\n%s", out.String())
			}
			// Every shared model is a stand-in whose scores mean nothing; the
			// summary says so, from the folder's own description, and how to
			// mount the real model.
			if s := out.String(); !strings.Contains(s, "a test stand-in (") || !strings.Contains(s, "scores near chance") ||
				!strings.Contains(s, "set MODEL_DIR to it") {
				t.Errorf("summary does not say the model is a test stand-in and how to mount the production model:\n%s", s)
			}
			t.Logf("summary:%s", out.String())
		})
	}
}

// TestMakeRunDemo runs scripts/run-demo.sh, what `make run` runs, as README
// says: from a checkout with bin/scorer and ONNX Runtime under .deps (ORT_LIB
// unset: the default beside the executable, whatever the working
// directory), on the in-memory broker the script asks for explicitly. It
// prints the summary, says in /metrics and at warn level in its log that
// the broker is in-memory, and stops cleanly on SIGTERM.
func TestMakeRunDemo(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the demo with the real model")
	}
	root := t.TempDir()
	// Where `make ort` puts the core, relative to the checkout.
	ortRel, err := filepath.Rel(testenv.RepoRoot(), testenv.DefaultORTLib())
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{"scripts", "bin", filepath.Dir(ortRel)} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	script, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "scripts", "run-demo.sh"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "scripts", "run-demo.sh"), script, 0o755); err != nil {
		t.Fatal(err)
	}
	// A copy, not a link: the default ORT_LIB follows the executable's own
	// folder.
	bin, err := os.ReadFile(scorerBinary(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "bin", "scorer"), bin, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(testenv.ORTLib(t), filepath.Join(root, ortRel)); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "demo.jsonl")
	if err := os.WriteFile(file, []byte(`{"call_id":"DEMO-A","sections":{"FILT_MD":["Consumers kept spending on travel."]}}`+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	metrics := freeAddr(t)
	cmd := exec.Command(filepath.Join(root, "scripts", "run-demo.sh"), "--metrics-addr", metrics, "--broker-addr", "127.0.0.1:0")
	cmd.Dir = t.TempDir() // the script finds its checkout itself
	env := withEnv(testenv.ScorerEnv(t), "TRANSCRIPTS", file, "DEMO_LIMIT", "1", "LABELS", "consumer weakness", "LOG_FORMAT", "json")
	delete(env, "ORT_LIB")
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); k != "ORT_LIB" && k != "KAFKA_BROKERS" && env[k] == "" {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	out, logs := &testenv.LockedBuffer{}, &testenv.LockedBuffer{}
	cmd.Stdout, cmd.Stderr = out, logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
		if t.Failed() {
			t.Logf("demo log:\n%s", testenv.Tail(logs.String(), 4000))
		}
	})
	waitUntil(t, 2*time.Minute, "the demo summary", func() bool {
		select {
		case err := <-exited:
			exited <- err
			t.Fatalf("the demo exited (%v) before its summary", err)
		default:
		}
		return strings.Contains(out.String(), "=== scorer demo summary ===")
	}, func() string { return testenv.Tail(logs.String(), 1500) })
	if got := testenv.MetricValue(testenv.Scrape(t, metrics), "scorer_embedded_broker"); got != 1 {
		t.Errorf("scorer_embedded_broker = %v, want 1", got)
	}
	warned := false
	for _, line := range strings.Split(logs.String(), "\n") {
		if strings.Contains(line, `"level":"warn"`) && strings.Contains(line, "in-memory Kafka broker") && strings.Contains(line, "NOT durable") {
			warned = true
		}
	}
	if !warned {
		t.Error("no warn-level log line says the broker is in-memory and not durable")
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		exited <- err
		if err != nil {
			t.Errorf("demo exited with %v after SIGTERM, want 0", err)
		}
	case <-time.After(30 * time.Second):
		t.Error("demo still running 30s after SIGTERM")
	}
}
