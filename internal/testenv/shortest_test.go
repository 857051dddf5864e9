package testenv

import (
	"bytes"
	"os"
	"reflect"
	"testing"

	"github.com/scorer/scorer/schema"
)

// TestSentenceCount: the scan counts what DecodeEvent counts for the plain
// shape, and declines (ok false) every other shape, so the caller decodes
// those lines.
func TestSentenceCount(t *testing.T) {
	for _, tc := range []struct {
		line string
		ok   bool
	}{
		{`{"call_id":"A","sections":{"FILT_MD":["One.","Two."],"FILT_QA":[]}}`, true},
		{` { "call_id" : 7 , "entity_id":null,"version_id":1.5e3, "sections" : { "FILT_MD" : [ "a" , "b" , "c" ] } } `, true},
		{`{"sections":{"X":[],"Y":["a"]},"call_id":"A"}`, true},
		{`{"call_id":"A","company_name":"Q\"uote\\","sections":{"X":["He said \"a, b\", then [c].","\\","x\\\"y"],"Y":["{\"k\": [1]}"]}}`, true},
		{`{"call_id":"A","sections":{"X":["é \u00e9 \ud83d\ude00"]}}`, true},
		// Not the plain shape: decoded by the caller.
		{`{"call_id":"A","sections":{"X":"['a', 'b']"}}`, false},                     // a Python list literal
		{`{"call_id":"A","sections":{"X":["a",null]}}`, false},                       // a non-string element
		{`{"call_id":"A","sections":{"X":["a"],"X":["b","c"]}}`, false},              // a repeated section
		{`{"call_id":"A","sections":{"X":["a"]},"sections":{"X":["b","c"]}}`, false}, // a repeated key
		{`{"call_id":"A","sect\u0069ons":{"X":["a"]}}`, false},                       // an escaped key
		{`{"CALL_ID":"A","FILT_MD":["a"]}`, false},                                   // seed columns
		{`{"schema":null,"payload":{"call_id":"A","sections":{"X":["a"]}}}`, false},  // an envelope
		{`{"op":"c","after":{"call_id":"A","sections":{"X":["a"]}}}`, false},         // a change event
		{`{"call_id":"A","extra":1,"sections":{"X":["a"]}}`, false},                  // another key
		{`{"call_id":{"x":1},"sections":{"X":["a"]}}`, false},                        // an object for a scalar
		{`{"call_id":"A"}`, false},                                                   // no sections
		{`{"call_id":"A","sections":null}`, false},
		{`{"call_id":"A","sections":{"X":["a"]}} x`, false}, // trailing bytes
		{`{"call_id":"A","sections":{"X":["a]}}`, false},    // an unterminated string
		{`{"call_id":"A","sections":{"X":["a" "b"]}}`, false},
		{`[1]`, false},
		{``, false},
	} {
		got, ok := sentenceCount([]byte(tc.line))
		if ok != tc.ok {
			t.Errorf("%s: ok %t, want %t", tc.line, ok, tc.ok)
			continue
		}
		if !ok {
			continue
		}
		ev, err := schema.DecodeEvent([]byte(tc.line), schema.DefaultLimits())
		if err != nil {
			t.Errorf("%s: DecodeEvent: %v", tc.line, err)
			continue
		}
		if want := ev.SentenceCount(); got != want {
			t.Errorf("%s: %d sentences, DecodeEvent %d", tc.line, got, want)
		}
	}
}

// TestShortestTranscriptsLean: on the real corpus the scan counts every
// line it counts as DecodeEvent does, and ShortestTranscriptsLean returns
// what ShortestTranscripts returns. It decodes the whole corpus in one
// goroutine: 3 s of CPU, 30 to 40 under the race detector, which has nothing
// to find in it, so it runs without -race only (make test-short, plain go
// test); the lean helper still checks each transcript it returns against its
// decoded count in every run.
func TestShortestTranscriptsLean(t *testing.T) {
	if RaceEnabled {
		t.Skip("decodes the whole corpus in one goroutine, 30-40 s of CPU under -race for nothing the race detector checks; make test-short runs it")
	}
	c := loadCorpus(t)
	lean := loadLean(t)
	if len(lean.lines) != len(c.lines) {
		t.Fatalf("%d lines, ShortestTranscripts' corpus %d", len(lean.lines), len(c.lines))
	}
	scanned := 0
	for i, l := range lean.lines {
		if !bytes.Equal(l.raw, c.lines[i].raw) || l.count != c.lines[i].count {
			t.Fatalf("line %d: %d sentences, decoded %d (or the bytes differ)", i+1, l.count, c.lines[i].count)
		}
		if _, ok := sentenceCount(l.raw); ok {
			scanned++
		}
	}
	t.Logf("%d of %d corpus lines counted by the scan, the rest decoded", scanned, len(c.lines))
	for _, n := range []int{1, 2, 3, 6, 24} {
		wantFile, wantEvs := ShortestTranscripts(t, n)
		gotFile, gotEvs := ShortestTranscriptsLean(t, n)
		want, _ := os.ReadFile(wantFile)
		got, _ := os.ReadFile(gotFile)
		if !bytes.Equal(got, want) || !reflect.DeepEqual(gotEvs, wantEvs) {
			t.Errorf("n=%d: ShortestTranscriptsLean differs from ShortestTranscripts", n)
		}
	}
}
