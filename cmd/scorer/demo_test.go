package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/scorer/scorer/internal/testenv"
)

// TestDemoSummaryWithBadAndRepeatedLines: a --demo-file with a line that
// is not an event and a call sent twice still gets its summary, once every
// produced record is handled (scored or dead-lettered), counting the two
// distinct calls. `make run` takes this path with MODEL_DIR, so it runs on
// every model folder.
func TestDemoSummaryWithBadAndRepeatedLines(t *testing.T) {
	file := filepath.Join(t.TempDir(), "demo.jsonl")
	a := `{"call_id":"DEMO-A","sections":{"FILT_MD":["Consumers kept spending on travel.","Margins were stable."]}}`
	b := `{"call_id":"DEMO-B","sections":{"FILT_MD":["Shoppers traded down to private label."]}}`
	if err := os.WriteFile(file, []byte(a+"\n"+b+"\nnot an event\n"+a+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, dir := range testenv.ModelDirs(t) {
		t.Run(filepath.Base(dir), func(t *testing.T) {
			env := withEnv(testenv.ScorerEnv(t), "MODEL_DIR", dir, "LABELS", "consumer weakness", "KAFKA_INPUT_PARTITIONS", "2")
			ctx, cancel := context.WithCancel(t.Context())
			out, logs := &lockedBuffer{}, &lockedBuffer{}
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
			t.Logf("summary:%s", out.String())
		})
	}
}
