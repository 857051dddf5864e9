package offline

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/scorer/scorer/internal/testenv"
	"github.com/scorer/scorer/schema"
)

// partialOf makes, in a folder of the test's, the partial output of an
// interrupted `scorer score --resume` over in (its settings record
// included), so tests can resume it under other settings or with forged
// lines.
//
// The run that makes it is the same for every test with the same input,
// settings and arguments, and its two files depend on neither the folder
// nor the test: it runs once per process and each test gets a copy (15
// identical scoring runs were most of this file's time).
func partialOf(t *testing.T, env map[string]string, in string, args ...string) (out, partial string, lines []string) {
	t.Helper()
	dir := t.TempDir()
	out = filepath.Join(dir, "out.jsonl")
	partial = out + partialSuffix
	raw, err := os.ReadFile(in)
	if err != nil {
		t.Fatal(err)
	}
	key := partialKey(raw, env, args)
	partialsMu.Lock()
	files, ok := partials[key]
	partialsMu.Unlock()
	if !ok {
		files = makePartial(t, env, raw, args)
		partialsMu.Lock()
		partials[key] = files
		partialsMu.Unlock()
	}
	if err := os.WriteFile(partial, files[0], 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(partial+settingsSuffix, files[1], 0o644); err != nil {
		t.Fatal(err)
	}
	lines = strings.SplitAfter(string(files[0]), "\n")
	return out, partial, lines[:len(lines)-1]
}

var (
	partialsMu sync.Mutex
	partials   = map[string][2][]byte{} // partialKey → the partial file and its settings record
)

func partialKey(raw []byte, env map[string]string, args []string) string {
	kv := make([]string, 0, len(env))
	for k, v := range env {
		kv = append(kv, k+"="+v)
	}
	slices.Sort(kv)
	return fmt.Sprintf("%x\x00%q\x00%q", sha256.Sum256(raw), kv, args)
}

// makePartial runs `scorer score --resume` over raw plus a broken last line:
// the run fails there and leaves the partial file (with the settings
// record) of the lines before it. It returns the two files' bytes.
func makePartial(t *testing.T, env map[string]string, raw []byte, args []string) [2][]byte {
	t.Helper()
	dir := t.TempDir()
	out := filepath.Join(dir, "out.jsonl")
	partial := out + partialSuffix
	failing := filepath.Join(dir, "in.jsonl")
	if err := os.WriteFile(failing, append(bytes.Clone(raw), "{\"call_id\": \"broken\"\n"...), 0o644); err != nil {
		t.Fatal(err)
	}
	_, stderr, err := runCLI(t, env, "", append([]string{"score", "--in", failing, "--out", out, "--resume"}, args...)...)
	if err == nil || !strings.Contains(err.Error(), "line") {
		t.Fatalf("setup run: %v, want it to stop at the broken line\n%s", err, stderr)
	}
	b, err := os.ReadFile(partial)
	if err != nil {
		t.Fatalf("no partial file after an interrupted run: %v", err)
	}
	if len(b) == 0 {
		t.Fatal("the partial file is empty")
	}
	settings, err := os.ReadFile(partial + settingsSuffix)
	if err != nil {
		t.Fatalf("no settings record beside the partial file: %v", err)
	}
	return [2][]byte{b, settings}
}

// TestResumeRefusesAnotherRunsPartial: a partial output records what it
// was scored with, and --resume refuses to continue it under anything that
// changes scores, naming the difference; the partial file is kept.
func TestResumeRefusesAnotherRunsPartial(t *testing.T) {
	shareModels(t)
	env := testenv.ScorerEnv(t)
	in, _ := testenv.ShortestTranscriptsLean(t, 2)
	for _, tc := range []struct {
		name string
		args []string
		env  map[string]string
		want string
	}{
		{"another model", []string{"--model", testenv.ModelDir(t, "nli-wordpiece-small")}, nil, "model_sha256"},
		{"other labels", nil, map[string]string{"LABELS": "consumer strength,consumer weakness"}, "labels"},
		{"another threshold", nil, map[string]string{"THRESHOLD": "0.5"}, "threshold"},
		{"another template", nil, map[string]string{"HYPOTHESIS_TEMPLATE": "The topic is {}."}, "hypothesis_template"},
		{"another score mode", nil, map[string]string{"SCORE_MODE": "entail_vs_contradiction", "ENTAILMENT_INDEX": "0"}, "score_mode"},
		{"another pair encoding", nil, map[string]string{"PAIR_ENCODING": "joined"}, "pair_encoding"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, partial, _ := partialOf(t, env, in)
			before, _ := os.ReadFile(partial)
			e := map[string]string{}
			for k, v := range env {
				e[k] = v
			}
			for k, v := range tc.env {
				e[k] = v
			}
			_, stderr, err := runCLI(t, e, "", append([]string{"score", "--in", in, "--out", out, "--resume"}, tc.args...)...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("resume under %s: err = %v, want a refusal naming %s\n%s", tc.name, err, tc.want, testenv.Tail(stderr, 1000))
			}
			if _, err := os.Stat(out); err == nil {
				t.Error("--out was written")
			}
			if after, _ := os.ReadFile(partial); !bytes.Equal(after, before) {
				t.Error("the partial file changed")
			}
		})
	}
}

// TestResumeRefusesForgedLines: every line of a partial file must be an
// output record this run could have written; one that is not is refused,
// never copied to --out.
func TestResumeRefusesForgedLines(t *testing.T) {
	shareModels(t)
	env := testenv.ScorerEnv(t)
	in, _ := testenv.ShortestTranscriptsLean(t, 2)
	forge := func(line string, edit func(*schema.ScoredTranscript)) string {
		var st schema.ScoredTranscript
		if err := json.Unmarshal([]byte(line), &st); err != nil {
			t.Fatal(err)
		}
		edit(&st)
		b, err := json.Marshal(st)
		if err != nil {
			t.Fatal(err)
		}
		return string(b) + "\n"
	}
	for _, tc := range []struct {
		name string
		line func(first string) string
		want string
	}{
		{"sections a string", func(first string) string {
			return strings.Replace(first, `"sections":{`, `"sections":"forged","x":{`, 1)
		}, "not an output record"},
		{"only a call_id", func(string) string { return `{"call_id":"A-1"}` + "\n" }, "not an output record"},
		{"a score above 1", func(first string) string {
			return forge(first, func(st *schema.ScoredTranscript) {
				for _, sec := range st.Sections {
					for _, lr := range sec.Results {
						if len(lr.Scores) > 0 {
							lr.Scores[0] = 1.5
							return
						}
					}
				}
			})
		}, "score"},
		{"a flag that disagrees with its score", func(first string) string {
			return forge(first, func(st *schema.ScoredTranscript) {
				for _, sec := range st.Sections {
					for _, lr := range sec.Results {
						if len(lr.Flags) > 0 {
							lr.Flags[0] = 1 - lr.Flags[0]
							return
						}
					}
				}
			})
		}, "flag"},
		{"another model's hash", func(first string) string {
			return forge(first, func(st *schema.ScoredTranscript) { st.Model.SHA256 = strings.Repeat("0", 64) })
		}, "model"},
		{"a label missing", func(first string) string {
			return forge(first, func(st *schema.ScoredTranscript) {
				for _, sec := range st.Sections {
					delete(sec.Results, st.Labels[0])
				}
			})
		}, "label"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, partial, lines := partialOf(t, env, in)
			forged := tc.line(lines[0])
			if err := os.WriteFile(partial, []byte(forged+strings.Join(lines[1:], "")), 0o644); err != nil {
				t.Fatal(err)
			}
			_, stderr, err := runCLI(t, env, "", "score", "--in", in, "--out", out, "--resume")
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("forged line %q: err = %v, want a refusal naming %q\n%s", testenv.Tail(forged, 200), err, tc.want, testenv.Tail(stderr, 1000))
			}
			if _, err := os.Stat(out); err == nil {
				t.Error("--out was written from a forged partial file")
			}
		})
	}

	t.Run("a partial file without its settings record", func(t *testing.T) {
		out, partial, _ := partialOf(t, env, in)
		if err := os.Remove(partial + settingsSuffix); err != nil {
			t.Fatal(err)
		}
		_, _, err := runCLI(t, env, "", "score", "--in", in, "--out", out, "--resume")
		if err == nil || !strings.Contains(err.Error(), "what they were scored with") {
			t.Fatalf("err = %v, want a refusal: no record of the settings", err)
		}
	})

	t.Run("the same settings resume and finish", func(t *testing.T) {
		out, partial, _ := partialOf(t, env, in)
		if _, stderr, err := runCLI(t, env, "", "score", "--in", in, "--out", out, "--resume"); err != nil {
			t.Fatalf("%v\n%s", err, stderr)
		}
		for _, p := range []string{partial, partial + settingsSuffix} {
			if _, err := os.Stat(p); err == nil {
				t.Errorf("%s left behind after success", p)
			}
		}
	})
}

// TestOutputRespectsUmask: a new --out gets 0666 less the umask, as files
// any other tool creates do (it was 0644 whatever the umask).
func TestOutputRespectsUmask(t *testing.T) {
	shareModels(t)
	env := testenv.ScorerEnv(t)
	in, _ := testenv.ShortestTranscriptsLean(t, 1)
	old := syscall.Umask(0o077)
	defer syscall.Umask(old)
	for _, args := range [][]string{nil, {"--resume"}} {
		out := filepath.Join(t.TempDir(), "out.jsonl")
		if _, stderr, err := runCLI(t, env, "", append([]string{"score", "--in", in, "--out", out}, args...)...); err != nil {
			t.Fatalf("%v\n%s", err, stderr)
		}
		if st, err := os.Stat(out); err != nil || st.Mode().Perm() != 0o600 {
			t.Errorf("score %v under umask 077: --out mode %v (%v), want 0600", args, st.Mode().Perm(), err)
		}
	}
}

// TestCommitSyncsTheFolder: after the rename, commit fsyncs --out's folder
// (the rename itself is only durable once the folder is), with the new
// file already in place; the real fsyncDir works on a real folder.
func TestCommitSyncsTheFolder(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "out.jsonl")
	o, err := createOutput(out)
	if err != nil {
		t.Fatal(err)
	}
	var synced []string
	o.syncDir = func(d string) error {
		b, err := os.ReadFile(out)
		if err != nil || string(b) != "done\n" {
			t.Errorf("folder synced before --out was in place: %q, %v", b, err)
		}
		synced = append(synced, d)
		return fsyncDir(d)
	}
	if _, err := o.f.WriteString("done\n"); err != nil {
		t.Fatal(err)
	}
	if err := o.commit(); err != nil {
		t.Fatal(err)
	}
	if len(synced) != 1 || synced[0] != dir {
		t.Errorf("folders synced: %q, want [%s]", synced, dir)
	}
	if err := fsyncDir(filepath.Join(dir, "missing")); err == nil {
		t.Error("fsyncDir of a missing folder: no error")
	}
}

// TestParquetPartialNeverReplacesAPart: new parts are numbered after the
// highest kept one, so a gap in the numbers (a part removed by hand) cannot
// make a new part overwrite a kept one; a part whose rows disagree with its
// footer is refused.
func TestParquetPartialNeverReplacesAPart(t *testing.T) {
	id := runIdentity{Model: "m", ModelSHA256: "abc", PairEncoding: "pair", HypothesisTemplate: "{}", Labels: []string{"a"}, Threshold: 0.5}
	scored := func(callID string, score float32) []schema.ScoredTranscript {
		flag, matches := 0, []string{}
		if score > 0.5 {
			flag, matches = 1, []string{"It grew."}
		}
		return []schema.ScoredTranscript{{
			CallID: callID, Model: schema.ModelInfo{Name: "m", SHA256: "abc"}, HypothesisTemplate: "{}", ScoreMode: "softmax",
			PairEncoding: "pair", Threshold: 0.5, Labels: []string{"a"}, ScoredAt: "2026-01-02T03:04:05Z",
			Sections: map[string]schema.SectionResult{"FILT_MD": {Sentences: 1, Text: []string{"It grew."},
				Results: map[string]schema.LabelResult{"a": {Scores: []float32{score}, Flags: []int{flag}, Matches: matches}}}},
		}}
	}
	dir := filepath.Join(t.TempDir(), "out.parquet.partial")
	p, err := openParquetPartial(dir, "", id)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []string{"A", "B"} {
		if err := p.write(scored(c, 0.7)); err != nil {
			t.Fatal(err)
		}
		if err := p.keep(); err != nil { // closes a part: part-000000, part-000001
			t.Fatal(err)
		}
	}
	kept := filepath.Join(dir, "part-000002.parquet")
	if err := os.Rename(filepath.Join(dir, "part-000001.parquet"), kept); err != nil {
		t.Fatal(err)
	}
	before, _ := os.ReadFile(kept)
	if p, err = openParquetPartial(dir, "", id); err != nil {
		t.Fatal(err)
	}
	if d := p.done(); len(d) != 2 || d[0].CallID != "A" || d[1].CallID != "B" || d[0].Sections["FILT_MD"] != 1 {
		t.Fatalf("kept transcripts %+v", d)
	}
	if err := p.write(scored("C", 0.2)); err != nil {
		t.Fatal(err)
	}
	if err := p.keep(); err != nil {
		t.Fatal(err)
	}
	if after, _ := os.ReadFile(kept); !bytes.Equal(after, before) {
		t.Error("a kept part was overwritten")
	}
	if _, err := os.Stat(filepath.Join(dir, "part-000003.parquet")); err != nil {
		t.Errorf("the new part is not part-000003: %v", err)
	}
	// Under another identity the parts are refused, naming the setting.
	other := id
	other.Threshold = 0.6
	if _, err := openParquetPartial(dir, "", other); err == nil || !strings.Contains(err.Error(), "threshold") {
		t.Errorf("another threshold: %v", err)
	}
}
