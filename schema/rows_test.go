package schema

import (
	"bytes"
	"encoding/json"
	"strconv"
	"testing"
)

func TestRows(t *testing.T) {
	st := sampleScored()
	rows := Rows(&st)
	if len(rows) != (2+1)*3 {
		t.Fatalf("got %d rows, want 9", len(rows))
	}
	// Stable order: sections sorted, then sentence, then labels as declared.
	var order []string
	for _, r := range rows {
		order = append(order, r.Section+"/"+strconv.Itoa(r.SentenceIndex)+"/"+r.Label[:10])
	}
	want := []string{
		"FILT_MD/0/consumer s", "FILT_MD/0/consumer w", "FILT_MD/0/reduced co",
		"FILT_MD/1/consumer s", "FILT_MD/1/consumer w", "FILT_MD/1/reduced co",
		"FILT_QA/0/consumer s", "FILT_QA/0/consumer w", "FILT_QA/0/reduced co",
	}
	for i := range want {
		if order[i] != want[i] {
			t.Fatalf("row %d = %s, want %s (all %v)", i, order[i], want[i], order)
		}
	}
	r := rows[5] // FILT_MD sentence 1, reduced spending: flagged
	if r.Flag != 1 || r.Score != 0.99 || r.Sentence != "Shoppers cut back." || r.ModelSHA256 != st.Model.SHA256 || r.PairEncoding != "joined" ||
		r.Threshold != 0.91 || r.CallID != "A-2020-Q4" || r.EntityID != "A" || r.ScoredAt != st.ScoredAt {
		t.Errorf("row 5 = %+v", r)
	}
	if rows[3].Sentence != "" || rows[3].Flag != 0 || rows[3].Score != 0.125 {
		t.Errorf("unflagged row 3 = %+v", rows[3])
	}
	keys := map[RowKey]bool{}
	for _, r := range rows {
		if keys[r.Key()] {
			t.Fatalf("duplicate key %+v", r.Key())
		}
		keys[r.Key()] = true
	}
	// Deterministic: map iteration order does not leak.
	for range 20 {
		again := Rows(&st)
		for i := range again {
			if again[i] != rows[i] {
				t.Fatalf("Rows not stable at %d", i)
			}
		}
	}
	if Rows(nil) != nil {
		t.Error("Rows(nil) != nil")
	}
	// Short Scores/Flags do not panic.
	st.Sections["FILT_QA"] = SectionResult{Sentences: 2, Results: map[string]LabelResult{"extra": {Scores: []float32{0.1}}}}
	if n := len(Rows(&st)); n != 6+2 {
		t.Errorf("got %d rows with a short result", n)
	}
}

func TestDeadLetterErrorHeaders(t *testing.T) {
	d := sampleDeadLetter()
	d.Headers = append(d.Headers, Header{Key: HeaderErrorsTopic, Value: []byte("stale")}, Header{Key: "b", Value: nil})
	hs := d.ErrorHeaders()
	want := []struct{ k, v string }{
		{"trace-id", "abc"}, {"b", ""},
		{"__connect.errors.topic", "transcripts"}, {"__connect.errors.partition", "2"},
		{"__connect.errors.offset", "42"}, {"__connect.errors.stage", "VALUE_CONVERTER"},
		{"__connect.errors.exception.class.name", "schema.DecodeError"},
		{"__connect.errors.exception.message", d.Message}, {"scorer.dlq.reason", "malformed_json"},
	}
	if len(hs) != len(want) {
		t.Fatalf("got %d headers: %+v", len(hs), hs)
	}
	for i, w := range want {
		if hs[i].Key != w.k || !bytes.Equal(hs[i].Value, []byte(w.v)) {
			t.Errorf("header %d = %s=%q, want %s=%q", i, hs[i].Key, hs[i].Value, w.k, w.v)
		}
	}
	if len(d.Headers) != 3 {
		t.Error("ErrorHeaders modified the original headers")
	}
}

// TestRowsCarrySentenceText: with the in-memory Text the scorer fills, every
// row, flagged or not, holds its sentence; Text never reaches the wire.
func TestRowsCarrySentenceText(t *testing.T) {
	st := sampleScored()
	md := st.Sections["FILT_MD"]
	md.Text = []string{"Sales rose.", "Shoppers cut back."}
	st.Sections["FILT_MD"] = md
	for _, r := range Rows(&st) {
		if r.Section == "FILT_MD" && r.Sentence != md.Text[r.SentenceIndex] {
			t.Errorf("row %s/%d/%s sentence %q, want %q", r.Section, r.SentenceIndex, r.Label, r.Sentence, md.Text[r.SentenceIndex])
		}
	}
	b, err := json.Marshal(st)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(b, []byte("Sales rose.")) {
		t.Errorf("SectionResult.Text leaked into the wire shape: %s", b)
	}
}
