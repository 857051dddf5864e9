package schema

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"reflect"
	"testing"
)

var update = flag.Bool("update", false, "rewrite schema/testdata golden files")

// golden compares got with testdata/name (rewriting it under -update).
func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test ./schema -update to create it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs from golden file:\ngot:  %s\nwant: %s", name, got, want)
	}
}

func indent(t *testing.T, b []byte) []byte {
	t.Helper()
	var out bytes.Buffer
	if err := json.Indent(&out, b, "", "  "); err != nil {
		t.Fatal(err)
	}
	out.WriteByte('\n')
	return out.Bytes()
}

// roundTrip checks the golden file for v and that decoding it gives v back.
func roundTrip[T any](t *testing.T, name string, v T) {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	golden(t, name, indent(t, b))
	raw, _ := os.ReadFile(filepath.Join("testdata", name))
	var back T
	if err := json.Unmarshal(raw, &back); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(back, v) {
		t.Errorf("%s: round trip changed the value:\ngot  %+v\nwant %+v", name, back, v)
	}
}

func TestGoldenWireShapes(t *testing.T) {
	st := sampleScored()
	rows := Rows(&st)
	roundTrip(t, "scored_transcript.json", st)
	roundTrip(t, "score_row.json", rows[0])
	roundTrip(t, "row_key.json", rows[0].Key())
	roundTrip(t, "dead_letter.json", sampleDeadLetter())

	env, err := EnvelopeScoredTranscript(&st)
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "scored_transcript.connect.json", indent(t, env))
	env, err = EnvelopeScoreRow(&rows[0])
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "score_row.connect.json", indent(t, env))
	env, err = EnvelopeRowKey(rows[0].Key())
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "row_key.connect.json", indent(t, env))

	// A Connect envelope's payload decodes back to the same value.
	var back struct {
		Payload ScoredTranscript `json:"payload"`
	}
	raw, _ := os.ReadFile(filepath.Join("testdata", "scored_transcript.connect.json"))
	if err := json.Unmarshal(raw, &back); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(back.Payload, st) {
		t.Errorf("connect payload round trip changed the value")
	}
}

// TestGoldenInputShapes decodes each input wire shape from testdata and
// checks the result against the lower-case golden event, then that the
// golden event itself round-trips through DecodeEvent.
func TestGoldenInputShapes(t *testing.T) {
	want := TranscriptEvent{
		CallID: "A-2020-Q4", EntityID: "A", CompanyName: "Agilent Technologies, Inc.",
		CallName: "Q4 2020 Earnings Call", EventTime: "2020-11-23T21:30:00Z", VersionID: "3",
		Sections: map[string][]string{
			"FILT_MD": {"Thank you, and welcome.", "Agilent's revenue grew."},
			"FILT_QA": {"What about \"China\"?", "It's fine — thanks."},
		},
	}
	b, _ := json.Marshal(want)
	golden(t, "event.json", indent(t, b))
	for _, name := range []string{"event.json", "event_seed.json", "event_seed_python.json", "event.connect.json", "event_seed.connect.json"} {
		t.Run(name, func(t *testing.T) {
			raw, err := os.ReadFile(filepath.Join("testdata", name))
			if err != nil {
				t.Fatal(err)
			}
			got, err := DecodeEvent(raw, DefaultLimits())
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("got %+v\nwant %+v", got, want)
			}
		})
	}
}
