package testenv

import (
	"os"
	"testing"

	"github.com/scorer/scorer/schema"
)

// FirstTranscripts is the corpus's first n events (Transcripts), each
// section cut to at most perSection sentences: real text, kept small for
// tests that score it with a real model. Only those n lines are read and
// decoded, through the one transcript reader (schema.ReadEvents).
func FirstTranscripts(t testing.TB, n, perSection int) []schema.TranscriptEvent {
	t.Helper()
	f, err := os.Open(Transcripts(t))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []schema.TranscriptEvent
	err = schema.ReadEvents(f, schema.DefaultLimits(), 64<<20, func(ev schema.TranscriptEvent, _ []byte) bool {
		for k, v := range ev.Sections {
			if len(v) > perSection {
				ev.Sections[k] = v[:perSection]
			}
		}
		out = append(out, ev)
		return len(out) < n
	})
	if err != nil || len(out) < n {
		t.Fatalf("read %d of %d transcripts: %v", len(out), n, err)
	}
	return out
}
