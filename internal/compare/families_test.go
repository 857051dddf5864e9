package compare

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"github.com/scorer/scorer/internal/testenv"
)

// TestCommandAcrossFamilies: `scorer compare` lines up two models of
// different families, each with its own tokenizer (DeBERTa-v3's Unigram,
// RoBERTa's and BART's byte-level BPE), on the same real sentences: every
// pair is compared once, each side is named by its own folder, and the
// random-weight tiny models' scores differ from the production
// architecture's in kind.
func TestCommandAcrossFamilies(t *testing.T) {
	shareModels(t)
	file, events, sentences, env := commandSample(t)
	if testing.Short() {
		file, events = testenv.ShortestTranscriptsLean(t, 1)
		sentences = events[0].SentenceCount()
	}
	for _, c := range []struct{ a, b string }{
		{testenv.ProductionArch, "nli-roberta-bpe-tiny"},
		{"nli-roberta-bpe-tiny", "nli-bart-bpe-tiny"},
	} {
		t.Run(c.a+" vs "+c.b, func(t *testing.T) {
			a, b := testenv.ModelDir(t, c.a), testenv.ModelDir(t, c.b)
			stdout, stderr, err := runCLI(t, env, "", "compare", "--in", file, "--a", a, "--b", b,
				"--threshold", "0.5", "--min-agreement", "0", "--json")
			if err != nil {
				t.Fatalf("%v\n%s", err, testenv.Tail(stderr, 2000))
			}
			var rep Report
			if err := json.Unmarshal([]byte(stdout), &rep); err != nil {
				t.Fatalf("--json output: %v\n%s", err, stdout)
			}
			if rep.Pairs != 3*sentences || rep.Transcripts != len(events) || len(rep.Labels) != 3 {
				t.Errorf("pairs %d transcripts %d labels %d; want %d, %d, 3", rep.Pairs, rep.Transcripts, len(rep.Labels), 3*sentences, len(events))
			}
			if !strings.Contains(rep.A.Name, filepath.Base(a)) || !strings.Contains(rep.B.Name, filepath.Base(b)) {
				t.Errorf("sides named %q and %q, want %s and %s", rep.A.Name, rep.B.Name, filepath.Base(a), filepath.Base(b))
			}
			if !(rep.MaxAbsDiff > 0.05) || !rep.Pass || rep.Agreement < 0 || rep.Agreement > 1 || rep.A.PairsPerSec <= 0 || rep.B.PairsPerSec <= 0 {
				t.Errorf("report: max |Δp| %v (want > 0.05: different models), pass %t, agreement %v, pairs/s %v and %v",
					rep.MaxAbsDiff, rep.Pass, rep.Agreement, rep.A.PairsPerSec, rep.B.PairsPerSec)
			}
		})
	}
}
