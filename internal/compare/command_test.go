package compare

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/scorer/scorer/internal/cli"
	"github.com/scorer/scorer/internal/testenv"
	"github.com/scorer/scorer/internal/testenv/sharedmodel"
	"github.com/scorer/scorer/schema"
)

// commandSample is the compare tests' input: the 3 shortest real
// transcripts (file and events), their sentence count and a CPU scorer
// environment.
func commandSample(t *testing.T) (string, []schema.TranscriptEvent, int, map[string]string) {
	file, events := testenv.ShortestTranscriptsLean(t, 3)
	sentences := 0
	for i := range events {
		sentences += events[i].SentenceCount()
	}
	env := testenv.ScorerEnv(t)
	env["DEVICE"] = "cpu"
	return file, events, sentences, env
}

// TestCommand compares real exports on real transcripts: in every model
// folder with an int8 file, fp32 against it passes a loose gate with small
// but nonzero differences; the in-test scorer's model (the production
// architecture) against a different model fails a strict one (exit 1).
func TestCommand(t *testing.T) {
	shareModels(t)
	file, events, sentences, env := commandSample(t)

	const int8File = "onnx/model_quantized.onnx"
	quantized := 0
	for _, dir := range testenv.ModelDirs(t) {
		if _, err := os.Stat(filepath.Join(dir, int8File)); err != nil {
			continue
		}
		quantized++
		if testing.Short() && quantized > 1 {
			t.Logf("-short: int8 of %s skipped, one int8 folder compared; make test compares every one", filepath.Base(dir))
			continue
		}
		t.Run("int8 of "+filepath.Base(dir), func(t *testing.T) {
			file, events, sentences := file, events, sentences
			if testing.Short() {
				// Both sides score every pair on the CPU: over the three
				// transcripts, the largest part of this package's -short
				// time.
				file, events = testenv.ShortestTranscriptsLean(t, 1)
				sentences = events[0].SentenceCount()
				t.Logf("-short: fp32 vs int8 over the shortest transcript (%d sentences); make test compares the three", sentences)
			}
			stdout, stderr, err := runCLI(t, env, "", "compare", "--in", file, "--a", dir, "--b-file", int8File,
				"--threshold", "0.5", "--min-agreement", "0.9", "--json")
			if err != nil {
				t.Fatalf("fp32 vs int8: %v\n%s", err, stderr)
			}
			var rep Report
			if err := json.Unmarshal([]byte(stdout), &rep); err != nil {
				t.Fatalf("--json output: %v\n%s", err, stdout)
			}
			if rep.Pairs != 3*sentences || rep.Transcripts != len(events) || len(rep.Labels) != 3 {
				t.Errorf("pairs %d transcripts %d labels %d; want %d, %d, 3", rep.Pairs, rep.Transcripts, len(rep.Labels), 3*sentences, len(events))
			}
			// int8 moves every score a little; a difference of 0 would mean the
			// same file was scored twice, one above 0.05 a broken export.
			if !(rep.MaxAbsDiff > 0 && rep.MaxAbsDiff < 0.05) || rep.P50AbsDiff > rep.P99AbsDiff || rep.P99AbsDiff > rep.MaxAbsDiff {
				t.Errorf("|Δp| max %v p99 %v p50 %v", rep.MaxAbsDiff, rep.P99AbsDiff, rep.P50AbsDiff)
			}
			if !rep.Pass || rep.Agreement < 0.9 || !strings.Contains(rep.B.Name, "model_quantized.onnx") || !strings.Contains(rep.A.Name, "model.onnx") ||
				rep.A.PairsPerSec <= 0 || rep.B.PairsPerSec <= 0 {
				t.Errorf("report %+v", rep)
			}
		})
	}
	if quantized == 0 {
		t.Errorf("no model folder has %s: the fp32-vs-int8 gate went untested", int8File)
	}

	// B is another model than A (MODEL_DIR): its scores differ in kind.
	other := ""
	for _, dir := range testenv.ModelDirs(t) {
		if filepath.Base(dir) != filepath.Base(env["MODEL_DIR"]) {
			other = dir
			break
		}
	}
	stdout, stderr, err := runCLI(t, env, "", "compare", "--in", file, "--b", other, "--threshold", "0.5", "--min-agreement", "1")
	if !errors.Is(err, ErrBelowAgreement) || cli.ExitCode(err) != 1 {
		t.Errorf("%s against %s at --min-agreement 1: %v (exit %d), want exit 1\n%s", filepath.Base(env["MODEL_DIR"]), filepath.Base(other),
			err, cli.ExitCode(err), testenv.Tail(stderr, 2000))
	}
	if !strings.Contains(stdout, "FAIL") || !strings.Contains(stdout, "flipped") {
		t.Errorf("text report of a failed gate:\n%s", stdout)
	}

	// One model, pair against joined: the encodings side by side, every
	// pair compared, and the scores move (the joined ids differ).
	stdout, stderr, err = runCLI(t, env, "", "compare", "--in", file, "--b-pair-encoding", "joined",
		"--threshold", "0.5", "--min-agreement", "0", "--json")
	if err != nil {
		t.Fatalf("pair vs joined: %v\n%s", err, stderr)
	}
	var rep Report
	if err := json.Unmarshal([]byte(stdout), &rep); err != nil {
		t.Fatal(err)
	}
	if rep.A.PairEncoding != "pair" || rep.B.PairEncoding != "joined" || rep.B.PairSeparator != "</s></s>" ||
		!strings.Contains(rep.B.Name, `joined "</s></s>" encoding`) || !strings.Contains(rep.A.Name, "pair encoding") {
		t.Errorf("sides %+v / %+v: want the two encodings named", rep.A, rep.B)
	}
	if rep.Pairs != 3*sentences || !(rep.MaxAbsDiff > 0.001) {
		t.Errorf("pair vs joined: %d pairs, max |Δp| %v; want every pair and visible differences", rep.Pairs, rep.MaxAbsDiff)
	}
	if _, _, err := runCLI(t, env, "", "compare", "--in", file, "--b-pair-encoding", "glued"); err == nil || !strings.Contains(err.Error(), "PAIR_ENCODING") {
		t.Errorf("--b-pair-encoding glued: %v, want an error naming PAIR_ENCODING", err)
	}

	if _, _, err := runCLI(t, env, "", "compare"); cli.ExitCode(err) != 2 {
		t.Errorf("no --in: %v (exit %d), want exit 2", err, cli.ExitCode(err))
	}
}

// TestCommandRelAttentionRewrite is issue 32's gate by hand, as the docs
// give it: on every shared model with DeBERTa's relative attention,
// `scorer compare` between REL_ATTENTION_REWRITE on and off scores real
// transcripts with A's graph rewritten and B's as exported, and agrees on
// every decision with scores within 1e-5.
func TestCommandRelAttentionRewrite(t *testing.T) {
	if testing.Short() {
		t.Skip("scores every shared model twice; make test runs it (-short keeps model's rewrite tests on the logits)")
	}
	shareModels(t)
	file, _, sentences, env := commandSample(t)
	rewritten := 0
	for _, dir := range testenv.ModelDirs(t) {
		stdout, stderr, err := runCLI(t, env, "", "compare", "--in", file, "--a", dir,
			"--a-rel-attention-rewrite=true", "--b-rel-attention-rewrite=false", "--threshold", "0.5", "--min-agreement", "1", "--json")
		if err != nil {
			t.Fatalf("%s: rewrite on vs off: %v\n%s", filepath.Base(dir), err, testenv.Tail(stderr, 2000))
		}
		var rep Report
		if err := json.Unmarshal([]byte(stdout), &rep); err != nil {
			t.Fatalf("--json output: %v\n%s", err, stdout)
		}
		if !strings.HasPrefix(rep.B.GraphRewrite, "graph as exported") {
			t.Errorf("%s: B's graph %q, want it as exported", filepath.Base(dir), rep.B.GraphRewrite)
		}
		if !strings.HasPrefix(rep.A.GraphRewrite, "relative attention rewritten") {
			t.Logf("%s: not rewritten (%s)", filepath.Base(dir), rep.A.GraphRewrite)
			continue
		}
		rewritten++
		if !rep.Pass || rep.Agreement != 1 || rep.FlipCount != 0 || rep.Pairs != 3*sentences || rep.MaxAbsDiff > 1e-5 {
			t.Errorf("%s: rewrite on vs off: pass %t, agreement %v, %d flips, %d pairs (want %d), max |Δp| %g",
				filepath.Base(dir), rep.Pass, rep.Agreement, rep.FlipCount, rep.Pairs, 3*sentences, rep.MaxAbsDiff)
		}
	}
	// nli-deberta-v3-tiny (make_deberta.py) and nli-deberta-v3-hf-tiny
	// (HF's TorchScript export).
	if rewritten < 2 {
		t.Errorf("%d shared models rewritten, want the two DeBERTa ones", rewritten)
	}
}

// `scorer compare` is the gate for a float16 export against its float32
// source on the same device: on real transcripts the fp16 file (float16
// logits, selected with --b-file as MODEL_FILE would) agrees on every
// decision within float16's precision, and the report names it by its own
// hash.
func TestCommandFloat16Gate(t *testing.T) {
	file, events := testenv.ShortestTranscriptsLean(t, 3)
	env := testenv.ScorerEnv(t)
	env["DEVICE"] = "cpu"
	dir := testenv.FP16ModelDir(t, env["MODEL_DIR"], false)
	env["MODEL_DIR"] = dir
	stdout, stderr, err := runCLI(t, env, "", "compare", "--in", file, "--b-file", testenv.FP16File,
		"--threshold", "0.5", "--min-agreement", "0.99", "--json")
	if err != nil {
		t.Fatalf("fp32 vs fp16: %v\n%s", err, stderr)
	}
	var rep Report
	if err := json.Unmarshal([]byte(stdout), &rep); err != nil {
		t.Fatalf("--json output: %v\n%s", err, stdout)
	}
	sum := testenv.ModelVersion(t, dir, testenv.FP16File)
	t.Logf("%d pairs of %d transcripts: max |Δp| %.2g, agreement %.4f", rep.Pairs, len(events), rep.MaxAbsDiff, rep.Agreement)
	if !(rep.MaxAbsDiff > 0 && rep.MaxAbsDiff < 0.01) || !rep.Pass || rep.Agreement < 0.99 ||
		!strings.Contains(rep.B.Name, testenv.FP16File) || !strings.Contains(rep.B.Name, sum[:12]) {
		t.Errorf("fp16 gate: max |Δp| %v (want in (0, 0.01)), agreement %v, pass %v, B %q (want %s, sha %.12s)",
			rep.MaxAbsDiff, rep.Agreement, rep.Pass, rep.B.Name, testenv.FP16File, sum)
	}
}

// shareModels makes each side of every `scorer compare` run of the test,
// until it ends, build its stack on the model its settings name loaded once
// per test process (sharedmodel.Open) instead of loading it again: the same
// model compareSide would load, each side still opening its own sessions,
// pool and scorer. TestCommandFloat16Gate, whose two sides are loaded
// nowhere else, loads its own through compareSide's own path.
func shareModels(t *testing.T) {
	t.Helper()
	prev := openStack
	openStack = sharedmodel.Open
	t.Cleanup(func() { openStack = prev })
}

// runCLI runs `scorer compare <args>` in-process; args[0] must be
// "compare" (the tests read like the command lines they stand for).
func runCLI(t *testing.T, env map[string]string, stdin string, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	if len(args) == 0 || args[0] != "compare" {
		t.Fatalf("runCLI: %q is not a compare command line", args)
	}
	var out, errb bytes.Buffer
	err = Command(context.Background(), cli.Env{Getenv: func(k string) string { return env[k] }, Stdin: strings.NewReader(stdin), Stdout: &out, Stderr: &errb}, args[1:])
	return out.String(), errb.String(), err
}
