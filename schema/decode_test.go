package schema

import (
	"errors"
	"reflect"
	"strings"
	"testing"
)

func TestDecodeEventShapes(t *testing.T) {
	want := TranscriptEvent{
		CallID: "A-2020-Q4", EntityID: "A", CompanyName: "Agilent", CallName: "Q4 call",
		EventTime: "2020-11-23T21:30:00Z", VersionID: "3",
		Sections: map[string][]string{"FILT_MD": {"Hello.", "it's"}, "FILT_QA": {"Q?"}},
	}
	lower := `{"call_id":"A-2020-Q4","entity_id":"A","company_name":"Agilent","call_name":"Q4 call",
		"event_time":"2020-11-23T21:30:00Z","version_id":"3",
		"sections":{"FILT_MD":["Hello.","it's"],"FILT_QA":["Q?"]}}`
	seedArrays := `{"CALL_ID":"A-2020-Q4","ENTITY_ID":"A","COMPANY_NAME":"Agilent","CALL_NAME":"Q4 call",
		"DATE":"2020-11-23","EVENT_DATETIME_UTC":"2020-11-23T21:30:00Z","VERSION_ID":3,
		"FILT_MD":["Hello.","it's"],"FILT_QA":["Q?"]}`
	seedPython := `{"CALL_ID":"A-2020-Q4","ENTITY_ID":"A","COMPANY_NAME":"Agilent","CALL_NAME":"Q4 call",
		"EVENT_DATETIME_UTC":"2020-11-23T21:30:00Z","VERSION_ID":"3",
		"FILT_MD":"['Hello.', \"it's\"]","FILT_QA":"['Q?']"}`
	tests := []struct{ name, in string }{
		{"lower", lower},
		{"seed arrays", seedArrays},
		{"seed python literal", seedPython},
		{"envelope lower", `{"schema":{"type":"struct","fields":[]},"payload":` + lower + `}`},
		{"envelope seed", `{"schema":null,"payload":` + seedPython + `}`},
		{"envelope map schema", `{"payload":` + seedArrays + `,"schema":{"type":"map"}}`},
		// A JDBC source from PostgreSQL lower-cases column names; hand-made
		// records mix cases. Section names stay upper case.
		{"seed lower-case columns", `{"call_id":"A-2020-Q4","entity_id":"A","company_name":"Agilent","call_name":"Q4 call",
			"event_datetime_utc":"2020-11-23T21:30:00Z","version_id":"3","filt_md":"['Hello.', \"it's\"]","Filt_Qa":"['Q?']"}`},
		{"seed lower-case identity, upper-case sentences", `{"call_id":"A-2020-Q4","entity_id":"A","company_name":"Agilent",
			"call_name":"Q4 call","event_datetime_utc":"2020-11-23T21:30:00Z","version_id":"3","FILT_MD":["Hello.","it's"],"FILT_QA":["Q?"]}`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := DecodeEvent([]byte(tc.in), DefaultLimits())
			if err != nil {
				t.Fatalf("DecodeEvent: %v", err)
			}
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("got %+v\nwant %+v", got, want)
			}
		})
	}
}

func TestDecodeEventSeedTimes(t *testing.T) {
	tests := []struct{ in, want string }{
		{`{"CALL_ID":"x","DATE":"2021-01-02","FILT_MD":["a"]}`, "2021-01-02"},
		{`{"CALL_ID":"x","DATE":18629,"FILT_MD":["a"]}`, "2021-01-02"},
		{`{"CALL_ID":"x","EVENT_DATETIME_UTC":1609556400000,"DATE":"2021-01-02","FILT_MD":["a"]}`, "2021-01-02T03:00:00Z"},
		{`{"CALL_ID":"x","EVENT_DATETIME_UTC":null,"DATE":"2021-01-02","FILT_MD":["a"]}`, "2021-01-02"},
	}
	for _, tc := range tests {
		got, err := DecodeEvent([]byte(tc.in), DefaultLimits())
		if err != nil {
			t.Fatalf("DecodeEvent(%s): %v", tc.in, err)
		}
		if got.EventTime != tc.want {
			t.Errorf("DecodeEvent(%s).EventTime = %q, want %q", tc.in, got.EventTime, tc.want)
		}
	}
}

func TestDecodeEventKeepsEmptyAndNUL(t *testing.T) {
	in := `{"call_id":"c","sections":{"S":["", "a\u0000b", "ok"],"E":[]}}`
	ev, err := DecodeEvent([]byte(in), DefaultLimits())
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"", "a\x00b", "ok"}; !reflect.DeepEqual(ev.Sections["S"], want) {
		t.Fatalf("S = %q, want %q", ev.Sections["S"], want)
	}
	if s, ok := ev.Sections["E"]; !ok || len(s) != 0 {
		t.Fatalf("empty section E should be kept, got %q %v", s, ok)
	}
}

func TestDecodeEventErrors(t *testing.T) {
	tests := []struct {
		name   string
		in     string
		reason Reason
		field  string
	}{
		{"empty", ``, ReasonMalformedJSON, ""},
		{"garbage", `{"call_id":`, ReasonMalformedJSON, ""},
		{"trailing data", `{"call_id":"a","sections":{"S":["x"]}} {}`, ReasonMalformedJSON, ""},
		{"array top", `[1,2]`, ReasonWrongType, ""},
		{"missing call_id", `{"sections":{"S":["x"]}}`, ReasonMissingField, "call_id"},
		{"blank call_id", `{"call_id":"  ","sections":{"S":["x"]}}`, ReasonMissingField, "call_id"},
		{"null call_id", `{"call_id":null,"sections":{"S":["x"]}}`, ReasonMissingField, "call_id"},
		{"bool call_id", `{"call_id":true,"sections":{"S":["x"]}}`, ReasonWrongType, "call_id"},
		{"missing sections", `{"call_id":"a"}`, ReasonMissingField, "sections"},
		{"seed column twice in two cases", `{"CALL_ID":"a","call_id":"b","FILT_MD":["x"]}`, ReasonWrongType, "CALL_ID"},
		{"seed lower-case without call_id", `{"filt_md":["x"]}`, ReasonMissingField, "call_id"},
		{"sections array", `{"call_id":"a","sections":[]}`, ReasonWrongType, "sections"},
		{"section number", `{"call_id":"a","sections":{"S":3}}`, ReasonWrongType, "sections.S"},
		{"sentence number", `{"call_id":"a","sections":{"S":["x",4]}}`, ReasonWrongType, "sections.S[1]"},
		{"sentence null", `{"call_id":"a","sections":{"S":[null]}}`, ReasonWrongType, "sections.S[0]"},
		{"company number", `{"call_id":"a","company_name":1,"sections":{"S":["x"]}}`, ReasonWrongType, "company_name"},
		{"no sentences", `{"call_id":"a","sections":{"S":[]}}`, ReasonNoSentences, "sections"},
		{"seed no sections", `{"CALL_ID":"a"}`, ReasonNoSentences, "sections"},
		{"seed bad python", `{"CALL_ID":"a","FILT_MD":"['x', None]"}`, ReasonWrongType, "FILT_MD"},
		{"seed FILT object", `{"CALL_ID":"a","FILT_MD":{}}`, ReasonWrongType, "FILT_MD"},
		{"seed bad date", `{"CALL_ID":"a","DATE":true,"FILT_MD":["x"]}`, ReasonWrongType, "DATE"},
		{"invalid utf8", "{\"call_id\":\"a\",\"sections\":{\"S\":[\"\xff\"]}}", ReasonInvalidUTF8, ""},
		{"lone surrogate", `{"call_id":"a","sections":{"S":["\ud800x"]}}`, ReasonInvalidUTF8, ""},
		{"lone low surrogate", `{"call_id":"a","sections":{"S":["\udc00"]}}`, ReasonInvalidUTF8, ""},
		{"envelope no schema", `{"payload":{"call_id":"a","sections":{"S":["x"]}}}`, ReasonBadEnvelope, "schema"},
		{"envelope no payload", `{"schema":{"type":"struct"}}`, ReasonBadEnvelope, "payload"},
		{"envelope extra", `{"schema":null,"payload":{"call_id":"a","sections":{"S":["x"]}},"x":1}`, ReasonBadEnvelope, ""},
		{"envelope payload string", `{"schema":null,"payload":"x"}`, ReasonBadEnvelope, "payload"},
		{"envelope payload null", `{"schema":null,"payload":null}`, ReasonBadEnvelope, "payload"},
		{"envelope bad schema", `{"schema":"struct","payload":{"call_id":"a","sections":{"S":["x"]}}}`, ReasonBadEnvelope, "schema"},
		{"envelope schema no type", `{"schema":{},"payload":{"call_id":"a","sections":{"S":["x"]}}}`, ReasonBadEnvelope, "schema.type"},
		{"envelope schema string type", `{"schema":{"type":"string"},"payload":{"call_id":"a","sections":{"S":["x"]}}}`, ReasonBadEnvelope, "schema.type"},
		{"nested envelope", `{"schema":null,"payload":{"schema":null,"payload":{"call_id":"a","sections":{"S":["x"]}}}}`, ReasonBadEnvelope, "payload"},
		{"empty section name", `{"call_id":"a","sections":{"":["x"]}}`, ReasonMissingField, "sections"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ev, err := DecodeEvent([]byte(tc.in), DefaultLimits())
			checkReason(t, ev, err, tc.reason)
			var de *DecodeError
			errors.As(err, &de)
			if de.Field != tc.field {
				t.Errorf("Field = %q, want %q (%v)", de.Field, tc.field, err)
			}
		})
	}
}

func checkReason(t *testing.T, ev TranscriptEvent, err error, want Reason) {
	t.Helper()
	if err == nil {
		t.Fatalf("accepted %+v, want %v", ev, want)
	}
	if !errors.Is(err, ErrInvalidEvent) {
		t.Fatalf("error %v does not wrap ErrInvalidEvent", err)
	}
	var de *DecodeError
	if !errors.As(err, &de) {
		t.Fatalf("error %T is not a *DecodeError", err)
	}
	if de.Reason != want {
		t.Fatalf("Reason = %v, want %v (%v)", de.Reason, want, err)
	}
	if !strings.HasPrefix(err.Error(), "schema: ") {
		t.Errorf("error %q lacks the package prefix", err)
	}
}

func TestDecodeEventLimits(t *testing.T) {
	sentence := func(n int) string { return `"` + strings.Repeat("a", n) + `"` }
	ev := func(sents ...string) []byte {
		return []byte(`{"call_id":"c","sections":{"S":[` + strings.Join(sents, ",") + `]}}`)
	}
	many := func(n int) []byte {
		s := make([]string, n)
		for i := range s {
			s[i] = `""`
		}
		return ev(s...)
	}

	// Deliberate decisions documented on DefaultLimits.
	if _, err := DecodeEvent(ev(sentence(1_000_000)), DefaultLimits()); err != nil {
		t.Errorf("1 MB sentence rejected: %v", err)
	}
	if _, err := DecodeEvent(ev(sentence(1<<20)), DefaultLimits()); err != nil {
		t.Errorf("1 MiB sentence (the inclusive limit) rejected: %v", err)
	}
	_, err := DecodeEvent(ev(sentence(1<<20+1)), DefaultLimits())
	checkReason(t, TranscriptEvent{}, err, ReasonTooLarge)

	if _, err := DecodeEvent(many(100_000), DefaultLimits()); err != nil {
		t.Errorf("100 000 sentences rejected: %v", err)
	}
	_, err = DecodeEvent(many(100_001), DefaultLimits())
	checkReason(t, TranscriptEvent{}, err, ReasonTooLarge)

	// Total over sections counts, not per section.
	lim := Limits{MaxSentences: 3}
	_, err = DecodeEvent([]byte(`{"call_id":"c","sections":{"A":["1","2"],"B":["3","4"]}}`), lim)
	checkReason(t, TranscriptEvent{}, err, ReasonTooLarge)

	_, err = DecodeEvent(ev(sentence(10)), Limits{MaxMessageBytes: 10})
	checkReason(t, TranscriptEvent{}, err, ReasonTooLarge)

	_, err = DecodeEvent([]byte(`{"call_id":"`+strings.Repeat("c", 5000)+`","sections":{"S":["x"]}}`), DefaultLimits())
	checkReason(t, TranscriptEvent{}, err, ReasonTooLarge)

	_, err = DecodeEvent([]byte(`{"call_id":"c","sections":{"A":["1"],"B":["2"]}}`), Limits{MaxSections: 1})
	checkReason(t, TranscriptEvent{}, err, ReasonTooLarge)

	// Negative disables a check.
	if _, err := DecodeEvent(ev(sentence(1<<20+1)), Limits{MaxSentenceBytes: -1}); err != nil {
		t.Errorf("negative MaxSentenceBytes should disable the check: %v", err)
	}
	// Python-literal sections are held to the same limits.
	_, err = DecodeEvent([]byte(`{"CALL_ID":"c","FILT_MD":"['aaaa']"}`), Limits{MaxSentenceBytes: 3})
	checkReason(t, TranscriptEvent{}, err, ReasonTooLarge)
}

func TestReasonString(t *testing.T) {
	want := map[Reason]string{
		ReasonMalformedJSON: "malformed_json", ReasonWrongType: "wrong_type", ReasonMissingField: "missing_field",
		ReasonNoSentences: "no_sentences", ReasonInvalidUTF8: "invalid_utf8", ReasonTooLarge: "too_large",
		ReasonBadEnvelope: "bad_envelope", Reason(99): "reason(99)",
	}
	for r, s := range want {
		if r.String() != s {
			t.Errorf("Reason(%d).String() = %q, want %q", int(r), r.String(), s)
		}
	}
}
