package offline

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/parquet-go/parquet-go"
	"github.com/parquet-go/parquet-go/deprecated"
	"github.com/parquet-go/parquet-go/format"

	"github.com/scorer/scorer/schema"
)

// fieldReader turns one top-level column of a row (its leaf columns'
// values, indexed by column) into JSON.
type fieldReader struct {
	name string
	read func(cols [][]parquet.Value) (json.RawMessage, error)
}

// leafFunc turns one non-null leaf value into JSON.
type leafFunc func(parquet.Value) (json.RawMessage, error)

var jsonNull = json.RawMessage("null")

// fieldReaders builds a reader per top-level column the decoder can use,
// and lists every column name.
func fieldReaders(sch *parquet.Schema) ([]fieldReader, []string, error) {
	var out []fieldReader
	var names []string
	for _, f := range sch.Fields() {
		names = append(names, f.Name())
		fr, err := fieldReaderOf(sch, f)
		if err != nil {
			if schema.InputColumn(f.Name()) {
				return nil, nil, fmt.Errorf("column %s: %w", f.Name(), err)
			}
			continue // a column the decoder never reads
		}
		out = append(out, fr)
	}
	return out, names, nil
}

func fieldReaderOf(sch *parquet.Schema, f parquet.Field) (fieldReader, error) {
	name := f.Name()
	lt := logical(f)
	switch {
	case f.Repeated():
		return fieldReader{}, errors.New("a repeated top-level column is not supported (use a LIST)")
	case f.Leaf():
		col, conv, err := leafOf(sch, name, []string{name})
		if err != nil {
			return fieldReader{}, err
		}
		return fieldReader{name: name, read: func(cols [][]parquet.Value) (json.RawMessage, error) {
			vs := cols[col.ColumnIndex]
			if len(vs) == 0 || vs[0].IsNull() {
				return jsonNull, nil
			}
			return conv(vs[0])
		}}, nil
	case isList(f, lt):
		elem, path := listElement(f, []string{name})
		if elem == nil || !elem.Leaf() {
			return fieldReader{}, errors.New("only a LIST of plain values is supported")
		}
		col, conv, err := leafOf(sch, name, path)
		if err != nil {
			return fieldReader{}, err
		}
		outerDef := optionalLevel(f)
		return fieldReader{name: name, read: func(cols [][]parquet.Value) (json.RawMessage, error) {
			return listJSON(cols[col.ColumnIndex], outerDef, col.MaxDefinitionLevel, conv)
		}}, nil
	case isMap(f, lt):
		return mapReader(sch, f)
	}
	return fieldReader{}, fmt.Errorf("type %v is not supported", f.Type())
}

func logical(n parquet.Node) format.LogicalTypeValue {
	if lt := n.Type().LogicalType(); lt != nil {
		return lt.Value
	}
	return nil
}

func converted(n parquet.Node) (deprecated.ConvertedType, bool) {
	if ct := n.Type().ConvertedType(); ct != nil {
		return *ct, true
	}
	return 0, false
}

func optionalLevel(n parquet.Node) int {
	if n.Optional() {
		return 1
	}
	return 0
}

func isList(n parquet.Node, lt format.LogicalTypeValue) bool {
	if _, ok := lt.(*format.ListType); ok {
		return true
	}
	ct, ok := converted(n)
	return ok && ct == deprecated.List
}

func isMap(n parquet.Node, lt format.LogicalTypeValue) bool {
	if _, ok := lt.(*format.MapType); ok {
		return true
	}
	ct, ok := converted(n)
	return ok && (ct == deprecated.Map || ct == deprecated.MapKeyValue)
}

// listElement finds a LIST's element node and its path: the standard
// three-level form (group LIST / repeated group list / element) or the
// legacy two-level one (group LIST / repeated element).
func listElement(list parquet.Node, path []string) (parquet.Node, []string) {
	fs := list.Fields()
	if len(fs) != 1 || !fs[0].Repeated() {
		return nil, nil
	}
	rep := fs[0]
	path = append(slices.Clone(path), rep.Name())
	if rep.Leaf() {
		return rep, path
	}
	if inner := rep.Fields(); len(inner) == 1 {
		return inner[0], append(path, inner[0].Name())
	}
	return nil, nil
}

// listJSON assembles one row's list from its leaf values: a single value
// below the repeated level is a null (below outerDef) or empty list; every
// other value is an element, null when below the element's full level.
func listJSON(vs []parquet.Value, outerDef, elemDef int, conv leafFunc) (json.RawMessage, error) {
	if len(vs) == 0 || (len(vs) == 1 && vs[0].DefinitionLevel() <= outerDef) {
		if len(vs) == 0 || vs[0].DefinitionLevel() < outerDef {
			return jsonNull, nil
		}
		return json.RawMessage("[]"), nil
	}
	out := []byte{'['}
	for i, v := range vs {
		if i > 0 {
			out = append(out, ',')
		}
		if v.DefinitionLevel() < elemDef {
			out = append(out, jsonNull...)
			continue
		}
		e, err := conv(v)
		if err != nil {
			return nil, err
		}
		out = append(out, e...)
	}
	return append(out, ']'), nil
}

// mapReader reads MAP<STRING, V> with V a plain value or a LIST of them.
func mapReader(sch *parquet.Schema, f parquet.Field) (fieldReader, error) {
	name := f.Name()
	kvs := f.Fields()
	if len(kvs) != 1 || !kvs[0].Repeated() || len(kvs[0].Fields()) != 2 {
		return fieldReader{}, errors.New("a MAP must hold one repeated key_value group")
	}
	kv := kvs[0]
	key, val := kv.Fields()[0], kv.Fields()[1]
	base := []string{name, kv.Name()}
	keyCol, keyConv, err := leafOf(sch, name, append(slices.Clone(base), key.Name()))
	if err != nil {
		return fieldReader{}, err
	}
	if _, ok := logical(key).(*format.StringType); !ok {
		if ct, ok := converted(key); !ok || ct != deprecated.UTF8 {
			return fieldReader{}, errors.New("only MAPs with STRING keys are supported")
		}
	}
	outerDef := optionalLevel(f)
	entryDef := outerDef + 1
	var valCol parquet.LeafColumn
	var valConv leafFunc
	var valJSON func(vs []parquet.Value) (json.RawMessage, error)
	switch lt := logical(val); {
	case val.Leaf():
		if valCol, valConv, err = leafOf(sch, name, append(slices.Clone(base), val.Name())); err != nil {
			return fieldReader{}, err
		}
		valJSON = func(vs []parquet.Value) (json.RawMessage, error) {
			if len(vs) == 0 || vs[0].DefinitionLevel() < valCol.MaxDefinitionLevel {
				return jsonNull, nil
			}
			return valConv(vs[0])
		}
	case isList(val, lt):
		elem, path := listElement(val, append(slices.Clone(base), val.Name()))
		if elem == nil || !elem.Leaf() {
			return fieldReader{}, errors.New("only MAP values that are plain values or LISTs of them are supported")
		}
		if valCol, valConv, err = leafOf(sch, name, path); err != nil {
			return fieldReader{}, err
		}
		listDef := entryDef + optionalLevel(val)
		valJSON = func(vs []parquet.Value) (json.RawMessage, error) {
			return listJSON(vs, listDef, valCol.MaxDefinitionLevel, valConv)
		}
	default:
		return fieldReader{}, errors.New("only MAP values that are plain values or LISTs of them are supported")
	}
	return fieldReader{name: name, read: func(cols [][]parquet.Value) (json.RawMessage, error) {
		keys, vals := cols[keyCol.ColumnIndex], cols[valCol.ColumnIndex]
		if len(keys) == 0 || keys[0].DefinitionLevel() < entryDef {
			if len(keys) == 0 || keys[0].DefinitionLevel() < outerDef {
				return jsonNull, nil
			}
			return json.RawMessage("{}"), nil
		}
		// A value of the value column at repetition level <= 1 starts
		// the next entry.
		var entries [][]parquet.Value
		for _, v := range vals {
			if v.RepetitionLevel() <= 1 || len(entries) == 0 {
				entries = append(entries, nil)
			}
			entries[len(entries)-1] = append(entries[len(entries)-1], v)
		}
		if len(entries) != len(keys) {
			return nil, &schema.DecodeError{Reason: schema.ReasonWrongType, Field: name, Err: fmt.Errorf("%d keys but %d values", len(keys), len(entries))}
		}
		out := []byte{'{'}
		for i, k := range keys {
			kj, err := keyConv(k)
			if err != nil {
				return nil, err
			}
			vj, err := valJSON(entries[i])
			if err != nil {
				return nil, err
			}
			if i > 0 {
				out = append(out, ',')
			}
			out = append(append(append(out, kj...), ':'), vj...)
		}
		return append(out, '}'), nil
	}}, nil
}

// leafOf finds the leaf column at path and how its values become JSON.
func leafOf(sch *parquet.Schema, field string, path []string) (parquet.LeafColumn, leafFunc, error) {
	col, ok := sch.Lookup(path...)
	if !ok {
		return col, nil, fmt.Errorf("no leaf column %s", strings.Join(path, "."))
	}
	conv, err := leafConverter(field, col.Node)
	return col, conv, err
}
