package offline

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"

	"github.com/parquet-go/parquet-go"
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
