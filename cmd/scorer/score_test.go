package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/scorer/scorer/schema"
)

// runCLI runs the binary's run() in-process with env and args.
func runCLI(t *testing.T, env map[string]string, stdin string, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	var out, errb bytes.Buffer
	err = run(context.Background(), args, func(k string) string { return env[k] }, strings.NewReader(stdin), &out, &errb)
	return out.String(), errb.String(), err
}

func TestScoreCommand(t *testing.T) {
	file, events := shortestTranscripts(t, 2)
	raw, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	env := baseEnv(t)

	t.Run("stdin to stdout keeps order and scores every sentence", func(t *testing.T) {
		stdout, stderr, err := runCLI(t, env, string(raw), "score", "--in", "-", "--out", "-")
		if err != nil {
			t.Fatalf("%v\n%s", err, stderr)
		}
		var got []schema.ScoredTranscript
		dec := json.NewDecoder(strings.NewReader(stdout))
		for dec.More() {
			var st schema.ScoredTranscript
			if err := dec.Decode(&st); err != nil {
				t.Fatal(err)
			}
			got = append(got, st)
		}
		if len(got) != len(events) {
			t.Fatalf("%d outputs for %d inputs", len(got), len(events))
		}
		for i, st := range got {
			if st.CallID != events[i].CallID {
				t.Errorf("output %d is %s, want %s", i, st.CallID, events[i].CallID)
			}
			for name, sents := range events[i].Sections {
				for _, label := range st.Labels {
					r := st.Sections[name].Results[label]
					if len(r.Scores) != len(sents) || len(r.Flags) != len(sents) {
						t.Errorf("%s/%s/%s: %d scores for %d sentences", st.CallID, name, label, len(r.Scores), len(sents))
					}
					for _, s := range r.Scores {
						if !(s >= 0 && s <= 1) {
							t.Errorf("%s: score %v outside [0,1]", st.CallID, s)
						}
					}
				}
			}
			if st.Model.SHA256 == "" || st.HypothesisTemplate != "This text is about {}." || st.Threshold != 0.91 {
				t.Errorf("header: %+v", st)
			}
		}
		if strings.Contains(stderr, "\r") {
			t.Error("progress bar drawn although stderr is not a terminal")
		}
	})

	bad := string(raw) + "{\"call_id\": \"broken\", \"sections\": {\n" + `{"sections": {"FILT_MD": ["no id"]}}` + "\n"
	t.Run("a bad line stops the run naming the line", func(t *testing.T) {
		_, _, err := runCLI(t, env, bad, "score")
		if err == nil || !strings.Contains(err.Error(), "line 3") {
			t.Fatalf("err = %v, want one naming line 3", err)
		}
	})

	t.Run("--skip-bad reports bad lines on stderr and goes on", func(t *testing.T) {
		out := filepath.Join(t.TempDir(), "out.jsonl")
		in := filepath.Join(t.TempDir(), "in.jsonl")
		if err := os.WriteFile(in, []byte(bad), 0o644); err != nil {
			t.Fatal(err)
		}
		_, stderr, err := runCLI(t, env, "", "score", "--in", in, "--out", out, "--skip-bad", "--progress", "on")
		if err != nil {
			t.Fatalf("%v\n%s", err, stderr)
		}
		if n := len(readJSONL[schema.ScoredTranscript](t, out)); n != len(events) {
			t.Errorf("%d outputs, want %d", n, len(events))
		}
		var reports []map[string]any
		for _, line := range strings.Split(stderr, "\n") {
			var rec map[string]any
			if json.Unmarshal([]byte(strings.TrimSpace(line)), &rec) == nil && rec["line"] != nil {
				reports = append(reports, rec)
			}
		}
		if len(reports) != 2 || reports[0]["line"] != 3.0 || reports[0]["reason"] != "malformed_json" ||
			reports[1]["line"] != 4.0 || reports[1]["reason"] != "missing_field" {
			t.Errorf("bad-line reports = %v", reports)
		}
		if !strings.Contains(stderr, "pairs/s") || !strings.Contains(stderr, "2 transcripts scored") {
			t.Errorf("progress line missing from stderr: %q", tail(stderr, 500))
		}
	})

	t.Run("a missing model is a clear error", func(t *testing.T) {
		_, _, err := runCLI(t, env, string(raw), "score", "--model", filepath.Join(t.TempDir(), "nope"))
		if err == nil || !strings.Contains(err.Error(), "MODEL_DIR") {
			t.Fatalf("err = %v", err)
		}
	})
}
