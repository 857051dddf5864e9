package offline

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/scorer/scorer/gpupool"
	"github.com/scorer/scorer/internal/cli"
	"github.com/scorer/scorer/internal/testenv"
	"github.com/scorer/scorer/internal/testenv/sharedmodel"
	"github.com/scorer/scorer/schema"
)

// runCLI runs `scorer <args>` in-process with env and args; args[0] must
// be "score" (the tests read like the command lines they stand for).
func runCLI(t *testing.T, env map[string]string, stdin string, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	if len(args) == 0 || args[0] != "score" {
		t.Fatalf("runCLI: %q is not a score command line", args)
	}
	var out, errb bytes.Buffer
	err = Command(context.Background(), cli.Env{Getenv: func(k string) string { return env[k] }, Stdin: strings.NewReader(stdin), Stdout: &out, Stderr: &errb}, args[1:])
	return out.String(), errb.String(), err
}

// shareModels makes every `scorer score` run of the test, until it ends,
// build its stack on the model its settings name loaded once per test
// process (sharedmodel.Open) instead of loading it again: the same model
// Command would load, each run still opening its own sessions, pool and
// scorer. The tests whose point is loading (TestScoreExternalDataModel, and
// TestScoreCommand's first run) load their own, through Command's own path.
func shareModels(t *testing.T) {
	t.Helper()
	prev := openStack
	openStack = sharedmodel.Open
	t.Cleanup(func() { openStack = prev })
}

func TestScoreCommand(t *testing.T) {
	file, events := testenv.ShortestTranscriptsLean(t, 2)
	raw, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	env := testenv.ScorerEnv(t)

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

	// The run above loaded the model through Command's own path; the rest
	// share one.
	shareModels(t)
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
		if n := len(testenv.ReadJSONL[schema.ScoredTranscript](t, out)); n != len(events) {
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
			t.Errorf("progress line missing from stderr: %q", testenv.Tail(stderr, 500))
		}
	})

	t.Run("a missing model is a clear error", func(t *testing.T) {
		_, _, err := runCLI(t, env, string(raw), "score", "--model", filepath.Join(t.TempDir(), "nope"))
		if err == nil || !strings.Contains(err.Error(), "MODEL_DIR") {
			t.Fatalf("err = %v", err)
		}
	})
}

// repeatShortest is the shortest real transcript as one JSONL line, and
// that line n times: enough lines for chunking without long scoring.
func repeatShortest(t *testing.T, n int) (line, lines string) {
	t.Helper()
	file, _ := testenv.ShortestTranscriptsLean(t, 1)
	raw, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	line = strings.TrimSpace(string(raw)) + "\n"
	return line, strings.Repeat(line, n)
}

// dirNames lists dir, so tests can see that no temporary file was left.
func dirNames(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names
}

func TestScoreOutputFile(t *testing.T) {
	shareModels(t)
	env := testenv.ScorerEnv(t)
	line, good := repeatShortest(t, 2)
	const previous = "previous output, must survive a failed run\n"

	t.Run("same file for --in and --out is refused and left unchanged", func(t *testing.T) {
		dir := t.TempDir()
		in := filepath.Join(dir, "x.jsonl")
		if err := os.WriteFile(in, []byte(good), 0o644); err != nil {
			t.Fatal(err)
		}
		hard := filepath.Join(dir, "hard.jsonl")
		if err := os.Link(in, hard); err != nil {
			t.Fatal(err)
		}
		for _, out := range []string{in, filepath.Join(dir, ".", "sub", "..", "x.jsonl"), hard} {
			_, stderr, err := runCLI(t, env, "", "score", "--in", in, "--out", out)
			if err == nil || cli.ExitCode(err) != 2 || !strings.Contains(err.Error(), "same file") {
				t.Errorf("--out %s: err = %v (exit %d), want a same-file usage error (exit 2)\n%s", out, err, cli.ExitCode(err), stderr)
			}
		}
		if b, _ := os.ReadFile(in); string(b) != good {
			t.Errorf("input changed: %d bytes, want %d", len(b), len(good))
		}
	})

	t.Run("a failed run leaves an existing --out byte-identical", func(t *testing.T) {
		dir := t.TempDir()
		in := filepath.Join(dir, "in.jsonl")
		if err := os.WriteFile(in, []byte(good+"{\"call_id\": \"broken\"\n"+line), 0o644); err != nil {
			t.Fatal(err)
		}
		out := filepath.Join(dir, "out.jsonl")
		if err := os.WriteFile(out, []byte(previous), 0o644); err != nil {
			t.Fatal(err)
		}
		_, _, err := runCLI(t, env, "", "score", "--in", in, "--out", out)
		if err == nil || !strings.Contains(err.Error(), "line 3") {
			t.Fatalf("err = %v, want one naming line 3", err)
		}
		_, _, err = runCLI(t, env, "", "score", "--in", in, "--out", out, "--model", filepath.Join(dir, "nope"))
		if err == nil || !strings.Contains(err.Error(), "MODEL_DIR") {
			t.Fatalf("bad model: err = %v", err)
		}
		if b, _ := os.ReadFile(out); string(b) != previous {
			t.Errorf("--out = %q, want it unchanged", b)
		}
		if names := dirNames(t, dir); len(names) != 2 {
			t.Errorf("files left in the output folder: %v", names)
		}
	})

	t.Run("a successful run replaces --out keeping its mode", func(t *testing.T) {
		dir := t.TempDir()
		in := filepath.Join(dir, "in.jsonl")
		if err := os.WriteFile(in, []byte(good), 0o644); err != nil {
			t.Fatal(err)
		}
		out := filepath.Join(dir, "out.jsonl")
		if err := os.WriteFile(out, []byte(previous), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, stderr, err := runCLI(t, env, "", "score", "--in", in, "--out", out); err != nil {
			t.Fatalf("%v\n%s", err, stderr)
		}
		if n := len(testenv.ReadJSONL[schema.ScoredTranscript](t, out)); n != 2 {
			t.Errorf("%d outputs, want 2", n)
		}
		if st, err := os.Stat(out); err != nil || st.Mode().Perm() != 0o600 {
			t.Errorf("--out mode: %v %v, want 0600", st.Mode(), err)
		}
		if names := dirNames(t, dir); len(names) != 2 {
			t.Errorf("files left in the output folder: %v", names)
		}
	})
}

func TestScoreBadLineStdout(t *testing.T) {
	shareModels(t)
	line, good := repeatShortest(t, 10)
	input := good + "{\"call_id\": \"broken\"\n" + line // line 11 is bad
	stdout, stderr, err := runCLI(t, testenv.ScorerEnv(t), input, "score", "--chunk", "8")
	if err == nil || !strings.Contains(err.Error(), "line 11") {
		t.Fatalf("err = %v, want one naming line 11\n%s", err, testenv.Tail(stderr, 2000))
	}
	n := 0
	dec := json.NewDecoder(strings.NewReader(stdout))
	for dec.More() {
		var st schema.ScoredTranscript
		if err := dec.Decode(&st); err != nil {
			t.Fatal(err)
		}
		n++
	}
	if n != 10 {
		t.Errorf("stdout holds %d results, want the 10 lines before the bad one", n)
	}
}

func TestScoreInterrupt(t *testing.T) {
	shareModels(t)
	env := testenv.ScorerEnv(t)
	line, _ := repeatShortest(t, 1)

	t.Run("cancel while waiting on stdin returns at once", func(t *testing.T) {
		pr, pw := io.Pipe()
		t.Cleanup(func() { pw.Close() }) // lets the left-behind reader end
		ctx, cancel := context.WithCancel(t.Context())
		out := filepath.Join(t.TempDir(), "out.jsonl")
		done := make(chan error, 1)
		var errb bytes.Buffer
		go func() {
			done <- Command(ctx, cli.Env{Getenv: func(k string) string { return env[k] }, Stdin: pr, Stdout: io.Discard, Stderr: &errb}, []string{"--out", out})
		}()
		// The write returns once the scorer has read the line: it is now
		// blocked on a stdin that never closes.
		if _, err := pw.Write([]byte(line)); err != nil {
			t.Fatal(err)
		}
		cancel()
		select {
		case err := <-done:
			if !errors.Is(err, cli.ErrInterrupted) || cli.ExitCode(err) != 130 {
				t.Errorf("err = %v (exit %d), want interrupted (exit 130)", err, cli.ExitCode(err))
			}
		case <-time.After(20 * time.Second):
			t.Fatal("score did not return within 20s of the cancel")
		}
		if names := dirNames(t, filepath.Dir(out)); len(names) != 0 {
			t.Errorf("interrupted run left %v", names)
		}
	})

}

// equalScored compares two outputs transcript by transcript: every field
// equal but scored_at, scores within 1e-5 (a resumed run batches pairs
// differently, which may move the last bits).
func equalScored(t *testing.T, got, want []schema.ScoredTranscript) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%d transcripts, want %d", len(got), len(want))
	}
	for i := range want {
		g, w := got[i], want[i]
		g.ScoredAt, w.ScoredAt = "", ""
		gs, ws := g.Sections, w.Sections
		g.Sections, w.Sections = nil, nil
		if !reflect.DeepEqual(g, w) || len(gs) != len(ws) {
			t.Fatalf("transcript %d differs:\n got %+v\nwant %+v", i, g, w)
		}
		for name, wsec := range ws {
			gsec := gs[name]
			for label, wl := range wsec.Results {
				gl := gsec.Results[label]
				if len(gl.Scores) != len(wl.Scores) {
					t.Fatalf("%s %s %s: %d scores, want %d", w.CallID, name, label, len(gl.Scores), len(wl.Scores))
				}
				for j := range wl.Scores {
					if math.Abs(float64(gl.Scores[j]-wl.Scores[j])) > 1e-5 {
						t.Fatalf("%s %s %s[%d] = %v, want %v", w.CallID, name, label, j, gl.Scores[j], wl.Scores[j])
					}
				}
				gl.Scores, wl.Scores = nil, nil
				if !reflect.DeepEqual(gl, wl) {
					t.Fatalf("%s %s %s differs: %+v vs %+v", w.CallID, name, label, gl, wl)
				}
			}
			gsec.Results, wsec.Results = nil, nil
			if !reflect.DeepEqual(gsec, wsec) {
				t.Fatalf("%s %s differs", w.CallID, name)
			}
		}
	}
}

// TestScoreResume interrupts a real `scorer score --resume` run once some
// transcripts are written, resumes it, and checks the final file against
// an uninterrupted run's: every transcript once, in input order.
func TestScoreResume(t *testing.T) {
	shareModels(t)
	env := testenv.ScorerEnv(t)
	in, events := testenv.ShortestTranscriptsLean(t, 6)
	dir := t.TempDir()
	out := filepath.Join(dir, "out.jsonl")
	partial := out + ".partial"

	// The run is cancelled as soon as the partial file holds two complete
	// transcripts: a real run, stopped as Ctrl-C would stop it.
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	go func() {
		for ctx.Err() == nil {
			if b, err := os.ReadFile(partial); err == nil && bytes.Count(b, []byte("\n")) >= 2 {
				cancel()
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
	}()
	var errb bytes.Buffer
	err := Command(ctx, cli.Env{Getenv: func(k string) string { return env[k] }, Stdout: io.Discard, Stderr: &errb},
		[]string{"--in", in, "--out", out, "--resume", "--chunk", "1"})
	if !errors.Is(err, cli.ErrInterrupted) {
		t.Fatalf("interrupted run: %v, want interrupted\n%s", err, errb.String())
	}
	if _, err := os.Stat(out); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("--out exists after an interrupted run: %v", err)
	}
	kept := testenv.ReadJSONL[schema.ScoredTranscript](t, partial)
	if len(kept) < 2 || len(kept) >= len(events) {
		t.Fatalf("the partial file holds %d transcripts; want 2..%d (the run was stopped early)", len(kept), len(events)-1)
	}
	// A crash can cut the last line short: it is dropped and rescored.
	f, err := os.OpenFile(partial, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString(`{"call_id": "cut-off-by-a-cra`)
	f.Close()

	stdout, stderr, err := runCLI(t, env, "", "score", "--in", in, "--out", out, "--resume", "--chunk", "1", "--progress", "on")
	if err != nil {
		t.Fatalf("resumed run: %v\n%s", err, stderr)
	}
	if stdout != "" {
		t.Errorf("resumed run wrote to stdout: %q", stdout)
	}
	if want := fmt.Sprintf("%d skipped", len(kept)); !strings.Contains(stderr, want) {
		t.Errorf("progress does not say %q:\n%s", want, testenv.Tail(stderr, 500))
	}
	if _, err := os.Stat(partial); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the partial file is still there after success: %v", err)
	}
	resumed := testenv.ReadJSONL[schema.ScoredTranscript](t, out)
	for i, st := range resumed {
		if st.CallID != events[i].CallID {
			t.Fatalf("output %d is %s, want %s (input order)", i, st.CallID, events[i].CallID)
		}
	}

	whole := filepath.Join(dir, "whole.jsonl")
	if _, stderr, err := runCLI(t, env, "", "score", "--in", in, "--out", whole); err != nil {
		t.Fatalf("uninterrupted run: %v\n%s", err, stderr)
	}
	equalScored(t, resumed, testenv.ReadJSONL[schema.ScoredTranscript](t, whole))
	// The kept transcripts were not rescored: they are byte for byte the
	// interrupted run's lines, scored_at included.
	for i := range kept {
		if resumed[i].ScoredAt != kept[i].ScoredAt {
			t.Errorf("transcript %d was rescored on resume", i)
		}
	}

	t.Run("a changed input is refused", func(t *testing.T) {
		// Two transcripts show it: the partial output of the two shortest
		// (the one the trust tests resume, made once per process) resumed
		// over those two swapped.
		in, _ := testenv.ShortestTranscriptsLean(t, 2)
		out, partial, _ := partialOf(t, env, in)
		raw, _ := os.ReadFile(in)
		lines := strings.SplitAfter(string(raw), "\n")
		swapped := filepath.Join(t.TempDir(), "swapped.jsonl")
		os.WriteFile(swapped, []byte(lines[1]+lines[0]+strings.Join(lines[2:], "")), 0o644)
		_, _, err := runCLI(t, env, "", "score", "--in", swapped, "--out", out, "--resume")
		if err == nil || !strings.Contains(err.Error(), "input changed") {
			t.Errorf("resume over a different input: %v", err)
		}
		if _, err := os.Stat(partial); err != nil {
			t.Errorf("the partial file was lost: %v", err)
		}
	})

	t.Run("--resume needs a file --out", func(t *testing.T) {
		if _, _, err := runCLI(t, env, "", "score", "--in", in, "--resume"); cli.ExitCode(err) != 2 {
			t.Errorf("--resume to stdout: %v (exit %d), want exit 2", err, cli.ExitCode(err))
		}
	})
}

// TestScoreExternalDataModel runs `scorer score` with the defaults, as a
// new user would, on the shared HF export re-saved with its weights in
// model.onnx_data (torch.onnx's and Optimum's form for large models): it
// scores, within 1e-5 of the same graph inline, and names the same model.
// Before lean loading, the relative-attention rewrite handed ORT an
// unlinked copy of the graph whose external data ORT could not resolve.
func TestScoreExternalDataModel(t *testing.T) {
	if testing.Short() {
		t.Skip("scores with the HF export inline and re-saved; make test runs it (-short keeps model's TestExternalDataVersion and TestSymlinkedModelFolder)")
	}
	file, events := testenv.ShortestTranscriptsLean(t, 2)
	inline := testenv.ModelDir(t, "nli-deberta-v3-hf-tiny")
	outs := map[string][]schema.ScoredTranscript{}
	for name, dir := range map[string]string{"inline": inline, "external": testenv.ExternalDataModelDir(t, inline, testenv.OneDataFile)} {
		env := testenv.ScorerEnv(t)
		env["MODEL_DIR"] = dir
		out := filepath.Join(t.TempDir(), "out.jsonl")
		if _, stderr, err := runCLI(t, env, "", "score", "--in", file, "--out", out); err != nil {
			t.Fatalf("%s: %v\n%s", name, err, testenv.Tail(stderr, 2000))
		}
		outs[name] = testenv.ReadJSONL[schema.ScoredTranscript](t, out)
	}
	got, want := outs["external"], outs["inline"]
	if len(got) != len(events) || len(want) != len(events) {
		t.Fatalf("%d and %d outputs for %d inputs", len(got), len(want), len(events))
	}
	for i := range want {
		if got[i].Model.Name != want[i].Model.Name || got[i].Model.SHA256 == want[i].Model.SHA256 {
			t.Errorf("model %+v, inline %+v: want the same name, a version covering the data file", got[i].Model, want[i].Model)
		}
		for name, sec := range want[i].Sections {
			for label, r := range sec.Results {
				g := got[i].Sections[name].Results[label].Scores
				if len(g) != len(r.Scores) {
					t.Fatalf("%s %s %s: %d scores, want %d", want[i].CallID, name, label, len(g), len(r.Scores))
				}
				for j := range r.Scores {
					if math.Abs(float64(g[j]-r.Scores[j])) > 1e-5 {
						t.Errorf("%s %s %s[%d] = %v, inline %v", want[i].CallID, name, label, j, g[j], r.Scores[j])
					}
				}
			}
		}
	}
}

// The summary says how busy each GPU was, and on a CPU run says nothing
// of a GPU: neither "score finished"'s log nor the progress line mentions
// one, so a CPU run never reads as an idle GPU.
func TestScoreSummaryGPUBusy(t *testing.T) {
	t.Run("GPU run", func(t *testing.T) {
		gpu0 := gpupool.Device{Kind: gpupool.CUDA, Index: 0}
		gpu1 := gpupool.Device{Kind: gpupool.CUDA, Index: 1}
		got := busyText([]gpupool.GPUBusy{{Device: gpu0, Samples: 4, Percent: 350}, {Device: gpu1, Unsupported: true}})
		if want := "cuda:0 88%, cuda:1 not readable (NVML)"; got != want {
			t.Errorf("busyText = %q, want %q", got, want)
		}
		if got, want := busyText([]gpupool.GPUBusy{{Device: gpu0}}), "cuda:0 not sampled yet"; got != want {
			t.Errorf("busyText without a reading = %q, want %q", got, want)
		}
	})
	t.Run("CPU run", func(t *testing.T) {
		shareModels(t)
		_, lines := repeatShortest(t, 2)
		env := testenv.ScorerEnv(t)
		out := filepath.Join(t.TempDir(), "out.jsonl")
		_, stderr, err := runCLI(t, env, lines, "score", "--in", "-", "--out", out, "--progress", "on")
		if err != nil {
			t.Fatalf("%v\n%s", err, stderr)
		}
		if !strings.Contains(stderr, "score finished") || !strings.Contains(stderr, "pairs/s") {
			t.Fatalf("no summary on stderr: %q", testenv.Tail(stderr, 800))
		}
		if strings.Contains(stderr, "gpu_busy") || strings.Contains(stderr, "GPU busy") {
			t.Errorf("a CPU run speaks of GPU busy: %q", testenv.Tail(stderr, 800))
		}
	})
}
