package proof

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/scorer/scorer/internal/testenv"
)

// abScript is scripts/gpu-ab.sh, issue 46's GPU A/B in one call.
var abScript = filepath.Join(testenv.RepoRoot(), "scripts", "gpu-ab.sh")

// words splits one line of the script's --dry-run output (each word
// shell-quoted with printf %q) back into the arguments bash would pass.
func words(t *testing.T, line string) []string {
	t.Helper()
	out, err := exec.Command("bash", "-c", `eval "set -- $1"; printf '%s\0' "$@"`, "_", line).Output()
	if err != nil {
		t.Fatalf("bash cannot read back %q: %v", line, err)
	}
	return strings.Split(strings.TrimSuffix(string(out), "\x00"), "\x00")
}

// envOf is the KEY=VALUE arguments of an `env K=V… timeout N cmd…` line
// and the command after them; it fails when anything between env and
// timeout is not a setting (ab37b.sh ran an unquoted setting as a command).
func envOf(t *testing.T, args []string) (map[string]string, []string) {
	t.Helper()
	if len(args) < 4 || args[0] != "env" {
		t.Fatalf("not an env command: %q", args)
	}
	key := regexp.MustCompile(`^[A-Z_][A-Z0-9_]*=`)
	settings := map[string]string{}
	for i, a := range args[1:] {
		if a == "timeout" {
			if _, err := strconv.Atoi(args[i+2]); err != nil {
				t.Fatalf("timeout without seconds: %q", args)
			}
			return settings, args[i+3:]
		}
		if !key.MatchString(a) {
			t.Fatalf("%q between env and timeout is not a setting: %q", a, args)
		}
		k, v, _ := strings.Cut(a, "=")
		settings[k] = v
	}
	t.Fatalf("no timeout in %q", args)
	return nil, nil
}

// The dry run prints every command of a full GPU A/B: paths with spaces
// and quotes arrive as one argument each, every variant's settings reach
// env as settings (never as the program), the variants alternate with the
// baseline and reverse order in the next round, and the shape bench,
// compare and the ncu window are all there.
func TestGPUABScriptDryRun(t *testing.T) {
	dir := filepath.Join(t.TempDir(), `it's a "dir"`)
	model, in, long, out := filepath.Join(dir, "model dir"), filepath.Join(dir, "t 30.jsonl"), filepath.Join(dir, "long $x.jsonl"), filepath.Join(dir, "out")
	cmd := exec.Command("bash", abScript, "--dry-run", "--scorer", filepath.Join(dir, "bin", "scorer"), "--model", model, "--in", in,
		"--long", long, "--out", out, "--variants", "pad8,mha,rows1024", "--rounds", "2")
	cmd.Env = append(os.Environ(), "DEVICE=cuda", "NCU=/opt/ncu dir/ncu")
	stdout, err := cmd.Output()
	if err != nil {
		t.Fatalf("dry run: %v\n%s", err, stdout)
	}
	want := map[string]map[string]string{
		"base":     {},
		"pad8":     {"PAD_TO_MULTIPLE_OF": "8"},
		"mha":      {"ATTENTION_REWRITES": "align,scale,mask,skipln,mha"},
		"rows1024": {"MAX_BATCH_ROWS": "1024", "MAX_BATCH_TOKENS": "65536"},
	}
	variantOf := func(env map[string]string) string {
		for name, w := range want {
			match := true
			for _, k := range []string{"PAD_TO_MULTIPLE_OF", "ATTENTION_REWRITES", "MAX_BATCH_ROWS"} {
				match = match && env[k] == w[k]
			}
			if match {
				return name
			}
		}
		return "?"
	}
	var scores, benches, compares, ncus []string
	for _, line := range strings.Split(strings.TrimSpace(string(stdout)), "\n") {
		env, rest := envOf(t, words(t, line))
		if env["MODEL_DIR"] != model || env["DEVICE"] != "cuda" || env["MODEL_FILE"] != "onnx/model_fp16.onnx" || env["SCORE_CACHE_BYTES"] != "0" {
			t.Errorf("common settings wrong in %q: %v", line, env)
		}
		v := variantOf(env)
		switch {
		case rest[0] == "/opt/ncu dir/ncu":
			if !slices.Contains(rest, "--launch-skip") || !slices.Contains(rest, filepath.Join(dir, "bin", "scorer")) || !slices.Contains(rest, in) {
				t.Errorf("ncu line: %q", rest)
			}
			ncus = append(ncus, v)
		case len(rest) > 1 && rest[1] == "score":
			i := slices.Index(rest, "--in")
			input := map[string]string{in: "t30", long: "long"}[rest[i+1]]
			scores = append(scores, input+":"+v)
		case len(rest) > 2 && rest[1] == "gpu-proof" && rest[2] == "bench":
			benches = append(benches, v)
		case len(rest) > 1 && rest[1] == "compare":
			if !slices.Contains(rest, "--b-rel-attention-rewrite") || rest[slices.Index(rest, "--a-device")+1] != "cuda" {
				t.Errorf("compare line: %q", rest)
			}
			compares = append(compares, v)
		default:
			t.Errorf("unexpected command %q", rest)
		}
	}
	wantScores := []string{
		"t30:base", "t30:pad8", "t30:mha", "t30:rows1024", "long:base", "long:pad8", "long:mha", "long:rows1024",
		"t30:base", "t30:rows1024", "t30:mha", "t30:pad8", "long:base", "long:rows1024", "long:mha", "long:pad8",
	}
	if !slices.Equal(scores, wantScores) {
		t.Errorf("score runs\n%v, want\n%v", scores, wantScores)
	}
	if w := []string{"base", "pad8", "mha", "rows1024"}; !slices.Equal(benches, w) {
		t.Errorf("shape benches %v, want %v", benches, w)
	}
	if w := []string{"base", "pad8", "mha"}; !slices.Equal(compares, w) {
		t.Errorf("compares %v, want %v", compares, w)
	}
	if w := []string{"base"}; !slices.Equal(ncus, w) {
		t.Errorf("ncu windows %v, want %v", ncus, w)
	}
	// commands.txt has the same commands, each with where its output went.
	rec, err := os.ReadFile(filepath.Join(out, "commands.txt"))
	if err != nil {
		t.Fatal(err)
	}
	if n := bytes.Count(rec, []byte("\n")); n != len(scores)+len(benches)+len(compares)+len(ncus) {
		t.Errorf("commands.txt has %d lines:\n%s", n, rec)
	}

	for _, bad := range [][]string{
		{"--scorer", "s", "--model", "m", "--in", "i", "--out", out, "--variants", "pad9"},
		{"--scorer", "s", "--model", "m", "--in", "i", "--out", out, "--compare", "nope"},
		{"--scorer", "s", "--model", "m", "--in", "i"},
		{"--scorer", "s", "--model", "m", "--in", "i", "--out", out, "--rounds", "two"},
		{"--scorer", "s", "--model", "m", "--in", "i", "--out", out, "--frobnicate"},
	} {
		err := exec.Command("bash", append([]string{abScript, "--dry-run"}, bad...)...).Run()
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 {
			t.Errorf("%q: err %v, want exit status 2", bad, err)
		}
	}
}

// One short A/B pair end to end on the CPU with the real scorer and the
// small model: both runs score every pair, summary.tsv has their pairs/s
// and no GPU busy figure, compare runs, and the GPU-only steps say they
// were skipped.
func TestGPUABScriptCPU(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "scorer")
	build := exec.Command("go", "build", "-o", bin, "./cmd/scorer")
	build.Dir = testenv.RepoRoot()
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	in, _ := testenv.ShortestTranscriptsLean(t, 1)
	out := filepath.Join(t.TempDir(), "ab out")
	cmd := exec.Command("bash", abScript, "--scorer", bin, "--model", testenv.ModelDir(t, testenv.ProductionArch), "--in", in,
		"--out", out, "--variants", "pad8", "--rounds", "1", "--compare", "base")
	cmd.Env = append(os.Environ(), "DEVICE=cpu", "ORT_LIB="+testenv.ORTLib(t), "CPU_CALIBRATION_CACHE=off")
	log, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("gpu-ab.sh: %v\n%s", err, log)
	}
	for _, w := range []string{"shape bench skipped: DEVICE=cpu", "ncu skipped: DEVICE=cpu", "compare base rc=0"} {
		if !strings.Contains(string(log), w) {
			t.Errorf("log lacks %q:\n%s", w, log)
		}
	}
	tsv, err := os.ReadFile(filepath.Join(out, "summary.tsv"))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(tsv)), "\n")
	if len(lines) != 3 {
		t.Fatalf("summary.tsv:\n%s", tsv)
	}
	var pairs []string
	for i, l := range lines[1:] {
		f := strings.Split(l, "\t")
		if len(f) != 9 || f[0] != []string{"base", "pad8"}[i] || f[3] != "0" || f[7] != "n/a" {
			t.Errorf("summary line %q", l)
			continue
		}
		if pps, err := strconv.ParseFloat(f[6], 64); err != nil || pps <= 0 {
			t.Errorf("pairs/s %q in %q", f[6], l)
		}
		pairs = append(pairs, f[4])
	}
	if len(pairs) != 2 || pairs[0] != pairs[1] || pairs[0] == "0" {
		t.Errorf("pairs scored by base and pad8: %v", pairs)
	}
	if !strings.Contains(lines[2], "PAD_TO_MULTIPLE_OF=8") {
		t.Errorf("pad8's line lacks its setting: %q", lines[2])
	}
	cmp, err := os.ReadFile(filepath.Join(out, "compare-base.json"))
	if err != nil || !bytes.Contains(cmp, []byte(`"agreement"`)) {
		t.Errorf("compare-base.json: %v\n%s", err, cmp)
	}
}
