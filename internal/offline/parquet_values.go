package offline

import (
	"encoding/json"
	"fmt"
	"math"
	"math/big"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/parquet-go/parquet-go"
	"github.com/parquet-go/parquet-go/deprecated"
	"github.com/parquet-go/parquet-go/format"

	"github.com/scorer/scorer/schema"
)

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
