package schema

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
)

// ValidateEnvelope checks that b is a Kafka Connect JsonConverter envelope
// (schemas.enable=true) whose payload matches its schema. Tests and tools
// use it to prove what sinks will accept; see validateConnect for the rules.
func ValidateEnvelope(b []byte) error {
	var e struct {
		Schema  *ConnectSchema  `json:"schema"`
		Payload json.RawMessage `json:"payload"`
	}
	if err := json.Unmarshal(b, &e); err != nil {
		return fmt.Errorf("schema: not a Connect envelope: %w", err)
	}
	if e.Schema == nil {
		return fmt.Errorf("schema: Connect envelope has no schema")
	}
	dec := json.NewDecoder(bytes.NewReader(e.Payload))
	dec.UseNumber()
	var payload any
	if err := dec.Decode(&payload); err != nil {
		return fmt.Errorf("schema: Connect envelope payload: %w", err)
	}
	if err := validateConnect(*e.Schema, payload, "$"); err != nil {
		return fmt.Errorf("schema: Connect payload does not match its schema: %w", err)
	}
	return nil
}

// validateConnect mirrors JsonConverter.convertToConnect (schemas.enable=true)
// closely enough to catch schema/payload drift: a required field may not be
// null or missing, integer types must hold integers in range, floats numbers,
// arrays/maps/structs the matching JSON kind. Unlike JsonConverter it also
// fails on payload fields the schema does not declare, because those would
// be silently dropped by a sink.
func validateConnect(s ConnectSchema, v any, path string) error {
	if v == nil {
		if s.Optional {
			return nil
		}
		return fmt.Errorf("%s: null for required %s field", path, s.Type)
	}
	switch s.Type {
	case "int8", "int16", "int32", "int64":
		n, ok := v.(json.Number)
		if !ok {
			return fmt.Errorf("%s: %T for %s", path, v, s.Type)
		}
		i, err := n.Int64()
		if err != nil {
			return fmt.Errorf("%s: %s is not an integer", path, n)
		}
		bits := map[string]uint{"int8": 8, "int16": 16, "int32": 32, "int64": 64}[s.Type]
		if bits < 64 && (i < -(1<<(bits-1)) || i >= 1<<(bits-1)) {
			return fmt.Errorf("%s: %d overflows %s", path, i, s.Type)
		}
	case "float32", "float64":
		n, ok := v.(json.Number)
		if !ok {
			return fmt.Errorf("%s: %T for %s", path, v, s.Type)
		}
		f, err := n.Float64()
		if err != nil || (s.Type == "float32" && math.Abs(f) > math.MaxFloat32) {
			return fmt.Errorf("%s: %s is not a %s", path, n, s.Type)
		}
	case "boolean":
		if _, ok := v.(bool); !ok {
			return fmt.Errorf("%s: %T for boolean", path, v)
		}
	case "string", "bytes":
		if _, ok := v.(string); !ok {
			return fmt.Errorf("%s: %T for %s", path, v, s.Type)
		}
	case "array":
		a, ok := v.([]any)
		if !ok || s.Items == nil {
			return fmt.Errorf("%s: %T for array (items %v)", path, v, s.Items)
		}
		for i, e := range a {
			if err := validateConnect(*s.Items, e, fmt.Sprintf("%s[%d]", path, i)); err != nil {
				return err
			}
		}
	case "map":
		m, ok := v.(map[string]any)
		if !ok || s.Keys == nil || s.Values == nil || s.Keys.Type != "string" {
			return fmt.Errorf("%s: %T for map with string keys", path, v)
		}
		for k, e := range m {
			if err := validateConnect(*s.Values, e, path+"."+k); err != nil {
				return err
			}
		}
	case "struct":
		m, ok := v.(map[string]any)
		if !ok {
			return fmt.Errorf("%s: %T for struct", path, v)
		}
		declared := map[string]bool{}
		for _, f := range s.Fields {
			if f.Field == "" || declared[f.Field] {
				return fmt.Errorf("%s: empty or duplicate field name %q", path, f.Field)
			}
			declared[f.Field] = true
			if err := validateConnect(f, m[f.Field], path+"."+f.Field); err != nil {
				return err
			}
		}
		for k := range m {
			if !declared[k] {
				return fmt.Errorf("%s: payload field %q not in schema", path, k)
			}
		}
	default:
		return fmt.Errorf("%s: unknown schema type %q", path, s.Type)
	}
	return nil
}
