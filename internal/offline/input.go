package offline

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/scorer/scorer/schema"
)

// record is one input transcript before decoding: its JSON, where it came
// from (for messages and --skip-bad's report) and, for a Parquet row that
// could not even be turned into JSON, why (a bad record like a bad line).
type record struct {
	data   []byte
	where  string         // "line 3", "part-00001.parquet row 12"
	report map[string]any // {"line": 3} or {"file": …, "row": 12}
	err    error
}

// source yields input records in order. next returns io.EOF after the
// last one; any other error ends the run (an unreadable file is not a bad
// record). progress is the share of the input read, in [0, 1], or -1 when
// the size is unknown (stdin). Sources are used from one goroutine, but
// progress may be called from another.
type source interface {
	next() (record, error)
	progress() float64
	close() error
}

// isParquet says whether --in or --out names Parquet: a .parquet file, or
// (for --in) a directory of part files as Spark writes them.
func isParquet(path string) bool {
	if strings.EqualFold(filepath.Ext(path), ".parquet") {
		return true
	}
	st, err := os.Stat(path)
	return err == nil && st.IsDir()
}

// openSource opens --in: JSONL (a file, or - for stdin) or Parquet.
func openSource(path string, stdin io.Reader) (source, error) {
	if path != "-" && isParquet(path) {
		return openParquetSource(path)
	}
	if path == "-" {
		return &jsonlSource{lines: schema.NewJSONLines(stdin, 0), closer: func() error { return nil }}, nil
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	s := &jsonlSource{lines: schema.NewJSONLines(f, 0), closer: f.Close}
	if st, err := f.Stat(); err == nil {
		s.size = st.Size()
	}
	return s, nil
}

// jsonlSource reads TranscriptEvent JSON lines (schema.JSONLines: blank
// lines skipped, no bound on a line's length: the decoder's MaxMessageBytes
// makes a long line a bad record, not the end of the run).
type jsonlSource struct {
	lines  *schema.JSONLines
	closer func() error
	size   int64 // 0 when unknown
}

func (s *jsonlSource) next() (record, error) {
	line, n, err := s.lines.Next()
	if errors.Is(err, io.EOF) {
		return record{}, io.EOF
	}
	if err != nil {
		return record{}, fmt.Errorf("read %w", err)
	}
	return record{data: bytes.TrimSpace(line), where: fmt.Sprintf("line %d", n), report: map[string]any{"line": n}}, nil
}

func (s *jsonlSource) progress() float64 {
	if s.size <= 0 {
		return -1
	}
	return min(float64(s.lines.Consumed())/float64(s.size), 1)
}

func (s *jsonlSource) close() error { return s.closer() }
