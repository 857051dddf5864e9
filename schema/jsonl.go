package schema

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"sync/atomic"
)

// ErrLineTooLong is a JSONL line longer than its reader's bound.
var ErrLineTooLong = errors.New("too long")

// JSONLines reads TranscriptEvent JSONL (the corpus, `scorer score --in`, a
// compare sample, `scorer produce --file`) one line at a time. It is the one
// place that says what a line is: the bytes up to '\n' without it (and
// without one '\r' before it, as bufio.ScanLines drops), a final line
// without '\n' included; lines of only white space are skipped; lines are
// numbered from 1 counting the skipped ones, so an error names the line a
// person finds in an editor. It does not decode: the demo and produce pass
// bad lines on for the scorer to judge; ReadEvents decodes.
//
// Next and Consumed may be called from different goroutines; Next from one.
type JSONLines struct {
	r        *bufio.Reader
	maxLine  int
	line     int
	consumed atomic.Int64
	err      error
}

// NewJSONLines reads r. maxLine bounds a line's bytes (0: no bound); a
// longer line is an error (ErrLineTooLong), read no further than the bound.
func NewJSONLines(r io.Reader, maxLine int) *JSONLines {
	return &JSONLines{r: bufio.NewReaderSize(r, 1<<20), maxLine: maxLine}
}

// Next returns the next line that is not blank and its number. The bytes
// are the caller's to keep. After the last line it returns io.EOF; a read
// error or a line over the bound is returned as "line N: …" and ends the
// stream (every later call returns it again).
func (l *JSONLines) Next() ([]byte, int, error) {
	for l.err == nil {
		l.line++
		line, err := l.readLine()
		switch {
		case errors.Is(err, io.EOF):
			l.err = io.EOF
		case err != nil:
			l.err = fmt.Errorf("line %d: %w", l.line, err)
			return nil, l.line, l.err
		}
		line = bytes.TrimSuffix(bytes.TrimSuffix(line, []byte{'\n'}), []byte{'\r'})
		if len(bytes.TrimSpace(line)) > 0 {
			return line, l.line, nil
		}
	}
	return nil, l.line, l.err
}

// readLine reads up to and including '\n' (or to the end of the stream),
// stopping past maxLine without reading the rest.
func (l *JSONLines) readLine() ([]byte, error) {
	var line []byte
	for {
		frag, err := l.r.ReadSlice('\n')
		l.consumed.Add(int64(len(frag)))
		line = append(line, frag...)
		if l.maxLine > 0 && len(bytes.TrimSuffix(bytes.TrimSuffix(line, []byte{'\n'}), []byte{'\r'})) > l.maxLine {
			return nil, fmt.Errorf("%w: over %d bytes", ErrLineTooLong, l.maxLine)
		}
		if !errors.Is(err, bufio.ErrBufferFull) {
			return line, err
		}
	}
}

// Consumed is how many bytes of the stream the lines returned and skipped
// so far took: what a progress report divides by the input's size.
func (l *JSONLines) Consumed() int64 { return l.consumed.Load() }

// ReadEvents decodes every line of r under lim, in order, and hands each
// event to fn with its line's bytes; fn returns false to stop reading. A
// line that does not decode ends the read with "line N: " and the
// *DecodeError: a sample, corpus or benchmark read silently short would
// mislead. maxLine is NewJSONLines's.
func ReadEvents(r io.Reader, lim Limits, maxLine int, fn func(ev TranscriptEvent, raw []byte) bool) error {
	lines := NewJSONLines(r, maxLine)
	for {
		raw, n, err := lines.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		ev, err := DecodeEvent(raw, lim)
		if err != nil {
			return fmt.Errorf("line %d: %w", n, err)
		}
		if !fn(ev, raw) {
			return nil
		}
	}
}
