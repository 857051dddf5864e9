package schema

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
)

// ConnectSchema is a Kafka Connect schema in the JSON form JsonConverter
// reads and writes with schemas.enable=true. It exists so scorer's output can
// go straight into Connect sinks (JDBC, S3, Elasticsearch) without a schema
// registry.
type ConnectSchema struct {
	Type     string          `json:"type"`
	Optional bool            `json:"optional"`
	Name     string          `json:"name,omitempty"`
	Field    string          `json:"field,omitempty"`
	Fields   []ConnectSchema `json:"fields,omitempty"`
	Items    *ConnectSchema  `json:"items,omitempty"`
	Keys     *ConnectSchema  `json:"keys,omitempty"`
	Values   *ConnectSchema  `json:"values,omitempty"`
}

// connectEnvelope is the JsonConverter wire form.
type connectEnvelope struct {
	Schema  *ConnectSchema `json:"schema"`
	Payload any            `json:"payload"`
}

// ConnectSchemaName is the prefix of struct schema names ("scorer.ScoreRow"),
// so Connect sinks that key on schema names (e.g. Avro conversion) see a
// stable, namespaced name.
const ConnectSchemaName = "scorer."

// Schemas for the output types, built once by reflection at init and then
// only read. Building them by reflection keeps them in lock-step with the Go
// structs: a new field cannot be forgotten in the schema.
var (
	scoredTranscriptSchema = mustSchemaOf(reflect.TypeFor[ScoredTranscript]())
	scoreRowSchema         = mustSchemaOf(reflect.TypeFor[ScoreRow]())
	rowKeySchema           = mustSchemaOf(reflect.TypeFor[RowKey]())
	eventKeySchema         = mustSchemaOf(reflect.TypeFor[EventKey]())
	eventRowKeySchema      = mustSchemaOf(reflect.TypeFor[EventRowKey]())
)

// SchemaOf returns the Connect schema for a Go type, built by reflection over
// its JSON encoding: bool → boolean, int8/16/32 → int8/16/32, int/int64/
// uint8/16/32 → int64, float32/64 → float32/64, string → string, slice/array
// → array, map[string]T → map, struct → struct named "scorer.<Type>" with one
// field per JSON-encoded field. A field is optional when its Go zero value
// can be left out or encoded as null: omitempty fields, pointers, slices and
// maps (a nil slice/map encodes as null, which JsonConverter rejects for a
// required field). Unsupported kinds (uint64, interfaces, channels, non-
// string map keys) return an error.
func SchemaOf(t reflect.Type) (*ConnectSchema, error) {
	s, err := schemaOf(t, map[reflect.Type]bool{})
	if err != nil {
		return nil, fmt.Errorf("schema: connect schema for %v: %w", t, err)
	}
	return s, nil
}

func mustSchemaOf(t reflect.Type) *ConnectSchema {
	s, err := SchemaOf(t)
	if err != nil {
		panic(err)
	}
	return s
}

func schemaOf(t reflect.Type, visiting map[reflect.Type]bool) (*ConnectSchema, error) {
	switch t.Kind() {
	case reflect.Bool:
		return &ConnectSchema{Type: "boolean"}, nil
	case reflect.Int8:
		return &ConnectSchema{Type: "int8"}, nil
	case reflect.Int16:
		return &ConnectSchema{Type: "int16"}, nil
	case reflect.Int32:
		return &ConnectSchema{Type: "int32"}, nil
	case reflect.Int, reflect.Int64, reflect.Uint8, reflect.Uint16, reflect.Uint32:
		return &ConnectSchema{Type: "int64"}, nil
	case reflect.Float32:
		return &ConnectSchema{Type: "float32"}, nil
	case reflect.Float64:
		return &ConnectSchema{Type: "float64"}, nil
	case reflect.String:
		return &ConnectSchema{Type: "string"}, nil
	case reflect.Pointer:
		s, err := schemaOf(t.Elem(), visiting)
		if err != nil {
			return nil, err
		}
		s.Optional = true
		return s, nil
	case reflect.Slice, reflect.Array:
		if t.Elem().Kind() == reflect.Uint8 {
			return &ConnectSchema{Type: "bytes", Optional: t.Kind() == reflect.Slice}, nil
		}
		items, err := schemaOf(t.Elem(), visiting)
		if err != nil {
			return nil, err
		}
		return &ConnectSchema{Type: "array", Items: items, Optional: t.Kind() == reflect.Slice}, nil
	case reflect.Map:
		if t.Key().Kind() != reflect.String {
			return nil, fmt.Errorf("map key %v: only string keys are supported", t.Key())
		}
		vals, err := schemaOf(t.Elem(), visiting)
		if err != nil {
			return nil, err
		}
		return &ConnectSchema{Type: "map", Keys: &ConnectSchema{Type: "string"}, Values: vals, Optional: true}, nil
	case reflect.Struct:
		if visiting[t] {
			return nil, fmt.Errorf("recursive type %v", t)
		}
		visiting[t] = true
		defer delete(visiting, t)
		s := &ConnectSchema{Type: "struct", Name: ConnectSchemaName + t.Name()}
		for i := 0; i < t.NumField(); i++ {
			f := t.Field(i)
			if !f.IsExported() || f.Anonymous {
				if f.Anonymous {
					return nil, fmt.Errorf("embedded field %s is not supported", f.Name)
				}
				continue
			}
			name, omitempty, skip := jsonName(f)
			if skip {
				continue
			}
			fs, err := schemaOf(f.Type, visiting)
			if err != nil {
				return nil, fmt.Errorf("field %s: %w", f.Name, err)
			}
			fs.Field = name
			if omitempty {
				fs.Optional = true
			}
			s.Fields = append(s.Fields, *fs)
		}
		return s, nil
	default:
		return nil, fmt.Errorf("kind %v is not supported", t.Kind())
	}
}

// jsonName mirrors encoding/json's tag rules for the cases our types use.
func jsonName(f reflect.StructField) (name string, omitempty, skip bool) {
	tag := f.Tag.Get("json")
	if tag == "-" {
		return "", false, true
	}
	name, opts, _ := strings.Cut(tag, ",")
	if name == "" {
		name = f.Name
	}
	for _, o := range strings.Split(opts, ",") {
		if o == "omitempty" || o == "omitzero" {
			omitempty = true
		}
	}
	return name, omitempty, false
}

// ConnectEnvelope wraps v in a JsonConverter envelope {"schema":…,"payload":…}
// with the schema derived from v's type by SchemaOf. The payload is encoded
// as record values are (MarshalValue: no HTML escaping).
func ConnectEnvelope(v any) ([]byte, error) {
	if v == nil {
		return nil, fmt.Errorf("schema: connect envelope of nil")
	}
	s, err := SchemaOf(reflect.TypeOf(v))
	if err != nil {
		return nil, err
	}
	return valueEnvelope(s, v)
}

func envelope(s *ConnectSchema, v any) ([]byte, error) {
	return envelopeWith(json.Marshal, s, v)
}

// valueEnvelope is envelope for record values, encoded as MarshalValue
// does. (Keys keep json.Marshal's form: a key's bytes are its identity in a
// compacted topic, so they must not change between releases.)
func valueEnvelope(s *ConnectSchema, v any) ([]byte, error) {
	return envelopeWith(MarshalValue, s, v)
}

func envelopeWith(marshal func(any) ([]byte, error), s *ConnectSchema, v any) ([]byte, error) {
	b, err := marshal(connectEnvelope{Schema: s, Payload: v})
	if err != nil {
		return nil, fmt.Errorf("schema: connect envelope: %w", err)
	}
	return b, nil
}

// MarshalValue is json.Marshal without its HTML escaping: <, > and & stay
// as they are instead of becoming six-byte \u003c escapes. Record values
// (results, rows) are encoded this way, so that the text they carry (a
// result's matches, a row's sentence) is never more than twice the bytes it
// took in the input record, which is what sizes the topics (see
// producer.Config.MaxResultBytes); the JSON is equivalent for every reader.
func MarshalValue(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}

// EnvelopeScoredTranscript returns st as a JsonConverter envelope using the
// precomputed ScoredTranscript schema. It fails only when st holds values
// JSON cannot carry (NaN or infinite scores).
func EnvelopeScoredTranscript(st *ScoredTranscript) ([]byte, error) {
	return valueEnvelope(scoredTranscriptSchema, st)
}

// EnvelopeScoreRow returns r as a JsonConverter envelope, the value format
// the Connect JDBC sink needs to upsert rows.
func EnvelopeScoreRow(r *ScoreRow) ([]byte, error) {
	return valueEnvelope(scoreRowSchema, r)
}

// EnvelopeRowKey returns k as a JsonConverter envelope, the key format the
// JDBC sink needs for pk.mode=record_key.
func EnvelopeRowKey(k RowKey) ([]byte, error) {
	return envelope(rowKeySchema, k)
}
