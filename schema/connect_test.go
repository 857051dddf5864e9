package schema

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"reflect"
	"testing"
)

// checkEnvelope parses a JsonConverter envelope and validates its payload.
func checkEnvelope(t *testing.T, env []byte) {
	t.Helper()
	if err := ValidateEnvelope(env); err != nil {
		t.Fatalf("%v\n%s", err, env)
	}
}

func TestConnectEnvelopesMatchSchema(t *testing.T) {
	full := sampleScored()
	sparse := sampleScored()
	sparse.EntityID, sparse.CompanyName, sparse.CallName, sparse.EventTime, sparse.VersionID = "", "", "", "", ""
	sparse.Source = nil
	nilSlices := ScoredTranscript{CallID: "x", Sections: map[string]SectionResult{"S": {Sentences: 1, Results: map[string]LabelResult{"l": {}}}}}
	for name, st := range map[string]ScoredTranscript{"full": full, "sparse": sparse, "nil slices": nilSlices, "zero": {}} {
		t.Run(name, func(t *testing.T) {
			env, err := EnvelopeScoredTranscript(&st)
			if err != nil {
				t.Fatal(err)
			}
			checkEnvelope(t, env)
			generic, err := ConnectEnvelope(st)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(generic, env) {
				t.Errorf("ConnectEnvelope and EnvelopeScoredTranscript differ")
			}
			for _, r := range Rows(&st) {
				env, err := EnvelopeScoreRow(&r)
				if err != nil {
					t.Fatal(err)
				}
				checkEnvelope(t, env)
				env, err = EnvelopeRowKey(r.Key())
				if err != nil {
					t.Fatal(err)
				}
				checkEnvelope(t, env)
			}
		})
	}
}

// TestValidatorCatchesDrift proves the validator can fail: a schema missing
// a field, a wrong type and a null in a required field are all reported.
func TestValidatorCatchesDrift(t *testing.T) {
	s := *rowKeySchema
	payload := map[string]any{"call_id": "a", "section": "S", "sentence_index": json.Number("1"), "label": "l"}
	if err := validateConnect(s, payload, "$"); err != nil {
		t.Fatalf("valid payload rejected: %v", err)
	}
	missing := s
	missing.Fields = s.Fields[:3]
	if validateConnect(missing, payload, "$") == nil {
		t.Error("undeclared payload field not reported")
	}
	wrong := map[string]any{"call_id": "a", "section": "S", "sentence_index": "1", "label": "l"}
	if validateConnect(s, wrong, "$") == nil {
		t.Error("string for int64 not reported")
	}
	null := map[string]any{"call_id": nil, "section": "S", "sentence_index": json.Number("1"), "label": "l"}
	if validateConnect(s, null, "$") == nil {
		t.Error("null in required field not reported")
	}
	i32 := ConnectSchema{Type: "int32"}
	if validateConnect(i32, json.Number("4294967296"), "$") == nil {
		t.Error("int32 overflow not reported")
	}
}

func TestSchemaOfTypes(t *testing.T) {
	type inner struct {
		A int32 `json:"a"`
	}
	type all struct {
		B   bool              `json:"b"`
		I8  int8              `json:"i8"`
		I   int               `json:"i"`
		F32 float32           `json:"f32"`
		F64 float64           `json:"f64,omitempty"`
		S   []string          `json:"s"`
		M   map[string]inner  `json:"m"`
		P   *inner            `json:"p"`
		Raw []byte            `json:"raw"`
		Out string            `json:"-"`
		N   map[string][]bool `json:"n"`
	}
	s, err := SchemaOf(reflect.TypeFor[all]())
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, f := range s.Fields {
		got[f.Field] = fmt.Sprintf("%s/%v", f.Type, f.Optional)
	}
	want := map[string]string{
		"b": "boolean/false", "i8": "int8/false", "i": "int64/false", "f32": "float32/false", "f64": "float64/true",
		"s": "array/true", "m": "map/true", "p": "struct/true", "raw": "bytes/true", "n": "map/true",
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %v\nwant %v", got, want)
	}
	if s.Name != "scorer.all" {
		t.Errorf("struct name %q", s.Name)
	}
	if _, err := SchemaOf(reflect.TypeFor[map[int]string]()); err == nil {
		t.Error("map[int]string accepted")
	}
	if _, err := SchemaOf(reflect.TypeFor[uint64]()); err == nil {
		t.Error("uint64 accepted")
	}
	if _, err := ConnectEnvelope(ScoredTranscript{Labels: []string{"x"}, Sections: map[string]SectionResult{"S": {Results: map[string]LabelResult{"x": {Scores: []float32{float32(math.NaN())}}}}}}); err == nil {
		t.Error("NaN score encoded")
	}
}
