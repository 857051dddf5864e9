package offline

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"math/big"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/parquet-go/parquet-go"
	"github.com/parquet-go/parquet-go/deprecated"
	"github.com/parquet-go/parquet-go/format"

	"github.com/scorer/scorer/schema"
)

// Parquet input. Each row becomes the JSON object the JSONL path would
// have read for it, and goes through schema.DecodeEvent like a line, so
// the two inputs cannot map a column differently: a STRING is a JSON
// string (FILT_* holding a Python list literal is parsed there), a
// LIST<STRING> an array, a DATE "YYYY-MM-DD", a TIMESTAMP (any unit, and
// Spark's legacy INT96) RFC 3339 in UTC with its full precision (a
// timestamp without time zone is read as UTC, as the seed's
// EVENT_DATETIME_UTC column is), integers and decimals numbers (kept as
// their literal text, as the decoder keeps numeric IDs), a null JSON null.
// MAP<STRING, LIST<STRING>> reads as an object, for the lower-case
// `sections` column. A column of another shape (a struct, a nested list)
// that the decoder reads is an error at open; any other such column is
// left out.

// parquetBatch is how many rows are read from a file at once.
const parquetBatch = 64

// parquetSource reads the rows of one Parquet file or of a directory of
// part files, in name order: Spark numbers its parts in write order.
type parquetSource struct {
	parts []parquetPart
	total int64 // rows in all parts
	read  atomic.Int64

	i       int // current part
	f       *os.File
	rows    *parquet.GenericReader[any]
	fields  []fieldReader
	extra   []string // `"name":value` of partition columns the file lacks
	numCols int
	row     int // rows read from the current part
	queue   []record
}

// parquetPart is one file to read; partition holds the Hive-style
// name=value directories above it (Spark's partitionBy), whose columns
// are not in the file.
type parquetPart struct {
	path, name string
	partition  [][2]string
}

// openParquetSource lists the files of path (a .parquet file, or a
// directory searched recursively for *.parquet, skipping names that start
// with "_" or "." as Spark and Hadoop mark their metadata: _SUCCESS,
// _temporary, .crc) and checks every footer up front.
func openParquetSource(path string) (*parquetSource, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	s := &parquetSource{}
	if !st.IsDir() {
		s.parts = []parquetPart{{path: path, name: filepath.Base(path)}}
	} else {
		err := filepath.WalkDir(path, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			name := d.Name()
			if p != path && (strings.HasPrefix(name, "_") || strings.HasPrefix(name, ".")) {
				if d.IsDir() {
					return filepath.SkipDir
				}
				return nil
			}
			if d.IsDir() || !strings.EqualFold(filepath.Ext(name), ".parquet") {
				return nil
			}
			rel, err := filepath.Rel(path, p)
			if err != nil {
				return err
			}
			part := parquetPart{path: p, name: rel}
			for _, dir := range strings.Split(filepath.Dir(rel), string(filepath.Separator)) {
				if k, v, ok := strings.Cut(dir, "="); ok && k != "" {
					if u, err := url.PathUnescape(v); err == nil {
						v = u
					}
					part.partition = append(part.partition, [2]string{k, v})
				}
			}
			s.parts = append(s.parts, part)
			return nil
		})
		if err != nil {
			return nil, err
		}
		if len(s.parts) == 0 {
			return nil, fmt.Errorf("%s holds no .parquet files", path)
		}
		slices.SortFunc(s.parts, func(a, b parquetPart) int { return strings.Compare(a.name, b.name) })
	}
	for _, p := range s.parts {
		f, pf, err := openParquetFile(p.path)
		if err != nil {
			return nil, err
		}
		_, _, err = fieldReaders(pf.Schema())
		s.total += pf.NumRows()
		f.Close()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", p.name, err)
		}
	}
	return s, nil
}

func openParquetFile(path string) (*os.File, *parquet.File, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, err
	}
	st, err := f.Stat()
	if err == nil {
		var pf *parquet.File
		if pf, err = parquet.OpenFile(f, st.Size()); err == nil {
			return f, pf, nil
		}
	}
	f.Close()
	return nil, nil, fmt.Errorf("%s is not a readable Parquet file: %w", path, err)
}

func (s *parquetSource) next() (record, error) {
	for len(s.queue) == 0 {
		if err := s.fill(); err != nil {
			return record{}, err
		}
	}
	r := s.queue[0]
	s.queue = s.queue[1:]
	s.read.Add(1)
	return r, nil
}

// fill converts the next batch of rows, opening the next part as needed.
// Rows are turned into JSON at once: their values may point into buffers
// the next read reuses.
func (s *parquetSource) fill() error {
	if s.rows == nil {
		if s.i >= len(s.parts) {
			return io.EOF
		}
		if err := s.openPart(); err != nil {
			return err
		}
	}
	part := s.parts[s.i]
	buf := make([]parquet.Row, parquetBatch)
	n, err := s.rows.ReadRows(buf)
	cols := make([][]parquet.Value, s.numCols)
	for _, row := range buf[:n] {
		s.row++
		for c := range cols {
			cols[c] = cols[c][:0]
		}
		for _, v := range row {
			cols[v.Column()] = append(cols[v.Column()], v)
		}
		rec := record{where: fmt.Sprintf("%s row %d", part.name, s.row), report: map[string]any{"file": part.name, "row": s.row}}
		rec.data, rec.err = s.rowJSON(cols)
		s.queue = append(s.queue, rec)
	}
	if errors.Is(err, io.EOF) {
		s.closePart()
		s.i++
		return nil
	}
	if err != nil {
		return fmt.Errorf("%s row %d: %w", part.name, s.row+1, err)
	}
	return nil
}

func (s *parquetSource) openPart() error {
	part := s.parts[s.i]
	f, pf, err := openParquetFile(part.path)
	if err != nil {
		return err
	}
	fields, names, err := fieldReaders(pf.Schema())
	if err != nil {
		f.Close()
		return fmt.Errorf("%s: %w", part.name, err)
	}
	s.f, s.fields, s.numCols, s.row = f, fields, len(pf.Schema().Columns()), 0
	s.rows = parquet.NewGenericReader[any](pf)
	s.extra = s.extra[:0]
	for _, kv := range part.partition {
		if slices.Contains(names, kv[0]) {
			continue
		}
		v := []byte("null")
		if kv[1] != "__HIVE_DEFAULT_PARTITION__" {
			v, _ = json.Marshal(kv[1])
		}
		k, _ := json.Marshal(kv[0])
		s.extra = append(s.extra, string(k)+":"+string(v))
	}
	return nil
}

func (s *parquetSource) closePart() {
	if s.rows != nil {
		s.rows.Close()
		s.f.Close()
		s.rows, s.f = nil, nil
	}
}

// rowJSON is one row as a JSON object: every readable column, then the
// partition columns.
func (s *parquetSource) rowJSON(cols [][]parquet.Value) ([]byte, error) {
	out := []byte{'{'}
	for i, fr := range s.fields {
		v, err := fr.read(cols)
		if err != nil {
			return nil, err
		}
		if i > 0 {
			out = append(out, ',')
		}
		k, _ := json.Marshal(fr.name)
		out = append(append(append(out, k...), ':'), v...)
	}
	for i, kv := range s.extra {
		if i > 0 || len(s.fields) > 0 {
			out = append(out, ',')
		}
		out = append(out, kv...)
	}
	return append(out, '}'), nil
}

func (s *parquetSource) progress() float64 {
	if s.total <= 0 {
		return -1
	}
	return min(float64(s.read.Load())/float64(s.total), 1)
}

func (s *parquetSource) close() error {
	s.closePart()
	return nil
}

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

// leafConverter maps a Parquet value type to the JSON the JSONL path
// would carry for it.
func leafConverter(field string, n parquet.Node) (leafFunc, error) {
	kind := n.Type().Kind()
	bad := func(reason schema.Reason, format string, args ...any) error {
		return &schema.DecodeError{Reason: reason, Field: field, Err: fmt.Errorf(format, args...)}
	}
	str := func(b []byte) (json.RawMessage, error) {
		if !utf8.Valid(b) {
			return nil, bad(schema.ReasonInvalidUTF8, "not valid UTF-8")
		}
		return json.Marshal(string(b))
	}
	switch lt := logical(n).(type) {
	case *format.StringType, *format.EnumType, *format.JsonType:
		return func(v parquet.Value) (json.RawMessage, error) { return str(v.ByteArray()) }, nil
	case *format.DateType:
		return func(v parquet.Value) (json.RawMessage, error) {
			return json.Marshal(time.Unix(0, 0).UTC().AddDate(0, 0, int(v.Int32())).Format(time.DateOnly))
		}, nil
	case *format.TimestampType:
		unit := lt.Unit.Value.Duration()
		return func(v parquet.Value) (json.RawMessage, error) {
			return timestampJSON(v.Int64(), unit), nil
		}, nil
	case *format.TimeType:
		unit := lt.Unit.Value.Duration()
		return func(v parquet.Value) (json.RawMessage, error) {
			d := time.Duration(v.Int64()) * unit
			if kind == parquet.Int32 {
				d = time.Duration(v.Int32()) * unit
			}
			return json.Marshal(time.Unix(0, 0).UTC().Add(d).Format("15:04:05.999999999"))
		}, nil
	case *format.DecimalType:
		scale := int(lt.Scale)
		return func(v parquet.Value) (json.RawMessage, error) {
			return json.RawMessage(decimalText(unscaled(v, kind), scale)), nil
		}, nil
	case *format.IntType:
		signed := lt.IsSigned
		return func(v parquet.Value) (json.RawMessage, error) {
			switch {
			case kind == parquet.Int32 && signed:
				return json.RawMessage(strconv.FormatInt(int64(v.Int32()), 10)), nil
			case kind == parquet.Int32:
				return json.RawMessage(strconv.FormatUint(uint64(v.Uint32()), 10)), nil
			case signed:
				return json.RawMessage(strconv.FormatInt(v.Int64(), 10)), nil
			}
			return json.RawMessage(strconv.FormatUint(v.Uint64(), 10)), nil
		}, nil
	case nil:
	default:
		return nil, fmt.Errorf("logical type %v is not supported", lt)
	}
	if ct, ok := converted(n); ok {
		switch ct {
		case deprecated.UTF8, deprecated.Enum, deprecated.Json:
			return func(v parquet.Value) (json.RawMessage, error) { return str(v.ByteArray()) }, nil
		case deprecated.Date:
			return leafConverter(field, parquet.Date())
		case deprecated.TimestampMillis, deprecated.TimestampMicros:
			unit := time.Millisecond
			if ct == deprecated.TimestampMicros {
				unit = time.Microsecond
			}
			return func(v parquet.Value) (json.RawMessage, error) { return timestampJSON(v.Int64(), unit), nil }, nil
		}
	}
	switch kind {
	case parquet.Boolean:
		return func(v parquet.Value) (json.RawMessage, error) { return json.Marshal(v.Boolean()) }, nil
	case parquet.Int32:
		return func(v parquet.Value) (json.RawMessage, error) {
			return json.RawMessage(strconv.FormatInt(int64(v.Int32()), 10)), nil
		}, nil
	case parquet.Int64:
		return func(v parquet.Value) (json.RawMessage, error) {
			return json.RawMessage(strconv.FormatInt(v.Int64(), 10)), nil
		}, nil
	case parquet.Int96:
		// Spark's and Impala's legacy timestamp: nanoseconds into the day,
		// then the Julian day number, little-endian.
		return func(v parquet.Value) (json.RawMessage, error) {
			i := v.Int96()
			nanos := int64(i[0]) | int64(i[1])<<32
			days := int64(i[2]) - 2440588 // the Julian day of 1970-01-01
			return timestampJSON(days*86400e9+nanos, time.Nanosecond), nil
		}, nil
	case parquet.Float, parquet.Double:
		return func(v parquet.Value) (json.RawMessage, error) {
			x := v.Double()
			if kind == parquet.Float {
				x = float64(v.Float())
			}
			if math.IsNaN(x) || math.IsInf(x, 0) {
				return nil, bad(schema.ReasonWrongType, "%v has no JSON form", x)
			}
			return json.Marshal(x)
		}, nil
	case parquet.ByteArray:
		// Plain binary: older writers' strings.
		return func(v parquet.Value) (json.RawMessage, error) { return str(v.ByteArray()) }, nil
	}
	return nil, fmt.Errorf("type %v is not supported", n.Type())
}

// timestampJSON renders n units since the epoch as RFC 3339 in UTC.
func timestampJSON(n int64, unit time.Duration) json.RawMessage {
	var t time.Time
	switch unit {
	case time.Millisecond:
		t = time.UnixMilli(n)
	case time.Microsecond:
		t = time.UnixMicro(n)
	default:
		t = time.Unix(0, n)
	}
	b, _ := json.Marshal(t.UTC().Format(time.RFC3339Nano))
	return b
}

// unscaled is a DECIMAL's unscaled integer: INT32, INT64, or big-endian
// two's complement bytes.
func unscaled(v parquet.Value, kind parquet.Kind) *big.Int {
	switch kind {
	case parquet.Int32:
		return big.NewInt(int64(v.Int32()))
	case parquet.Int64:
		return big.NewInt(v.Int64())
	}
	b := v.ByteArray()
	n := new(big.Int).SetBytes(b)
	if len(b) > 0 && b[0]&0x80 != 0 {
		n.Sub(n, new(big.Int).Lsh(big.NewInt(1), uint(8*len(b))))
	}
	return n
}

// decimalText writes n·10^-scale exactly, as JSON number text.
func decimalText(n *big.Int, scale int) string {
	s := new(big.Int).Abs(n).String()
	if scale > 0 {
		if len(s) <= scale {
			s = strings.Repeat("0", scale-len(s)+1) + s
		}
		s = s[:len(s)-scale] + "." + s[len(s)-scale:]
	} else if scale < 0 {
		s += strings.Repeat("0", -scale)
	}
	if n.Sign() < 0 {
		s = "-" + s
	}
	return s
}
