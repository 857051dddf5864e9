package schema

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// reasonByName maps a poison file's name prefix to the Reason it must yield.
func reasonByName(t *testing.T, name string) Reason {
	t.Helper()
	prefix, _, ok := strings.Cut(name, "__")
	if !ok {
		t.Fatalf("poison file %s: name must be <reason>__<what>.json", name)
	}
	for r := ReasonMalformedJSON; r <= ReasonBadEnvelope; r++ {
		if r.String() == prefix {
			return r
		}
	}
	t.Fatalf("poison file %s: unknown reason %q", name, prefix)
	return ReasonUnknown
}

// TestPoisonCorpus decodes every file in testdata/poison and checks the
// Reason encoded in its name, so the DLQ reason for each class of bad input
// is pinned down.
func TestPoisonCorpus(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("testdata", "poison", "*.json"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) < 10 {
		t.Fatalf("poison corpus has only %d files", len(files))
	}
	seen := map[Reason]bool{}
	for _, f := range files {
		name := filepath.Base(f)
		t.Run(name, func(t *testing.T) {
			data, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			want := reasonByName(t, name)
			seen[want] = true
			ev, err := DecodeEvent(data, DefaultLimits())
			checkReason(t, ev, err, want)
		})
	}
	for r := ReasonMalformedJSON; r <= ReasonBadEnvelope; r++ {
		if r != ReasonTooLarge && !seen[r] {
			t.Errorf("poison corpus has no %v file", r)
		}
	}
}

// TestPoisonHugeSentence is the too_large member of the poison corpus,
// generated here instead of committing megabytes.
func TestPoisonHugeSentence(t *testing.T) {
	huge := strings.Repeat("x", DefaultMaxSentenceBytes+1)
	for _, in := range []string{
		`{"call_id":"a","sections":{"S":["` + huge + `"]}}`,
		`{"CALL_ID":"a","FILT_MD":"['` + huge + `']"}`,
	} {
		ev, err := DecodeEvent([]byte(in), DefaultLimits())
		checkReason(t, ev, err, ReasonTooLarge)
	}
	big := `{"call_id":"a","sections":{"S":["` + strings.Repeat("x", DefaultMaxMessageBytes) + `"]}}`
	ev, err := DecodeEvent([]byte(big), DefaultLimits())
	checkReason(t, ev, err, ReasonTooLarge)
}
