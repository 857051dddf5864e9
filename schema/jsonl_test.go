package schema

import (
	"errors"
	"io"
	"strings"
	"testing"
)

// TestJSONLinesSplitsAsTheReadersDid: what every JSONL reader of the
// project took a line to be (blank lines skipped but counted, CRLF ends,
// a last line without '\n'), with the bytes consumed for progress.
func TestJSONLinesSplitsAsTheReadersDid(t *testing.T) {
	in := "a\n\n  \t\nb\r\n c \nlast"
	l := NewJSONLines(strings.NewReader(in), 0)
	type got struct {
		text string
		line int
	}
	var all []got
	for {
		b, n, err := l.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, got{string(b), n})
	}
	want := []got{{"a", 1}, {"b", 4}, {" c ", 5}, {"last", 6}}
	if len(all) != len(want) {
		t.Fatalf("lines %+v, want %+v", all, want)
	}
	for i := range want {
		if all[i] != want[i] {
			t.Errorf("line %d: %+v, want %+v", i, all[i], want[i])
		}
	}
	if c := l.Consumed(); c != int64(len(in)) {
		t.Errorf("consumed %d bytes, want %d", c, len(in))
	}
	if _, _, err := l.Next(); !errors.Is(err, io.EOF) {
		t.Errorf("after the end: %v, want io.EOF", err)
	}
}

// TestJSONLinesBound: a line over the bound is an error naming it, read no
// further; a line at the bound (its '\r\n' not counted) is not.
func TestJSONLinesBound(t *testing.T) {
	l := NewJSONLines(strings.NewReader("12345\r\n\n123456\nnext\n"), 5)
	if b, _, err := l.Next(); err != nil || string(b) != "12345" {
		t.Fatalf("a line at the bound: %q, %v", b, err)
	}
	_, n, err := l.Next()
	if !errors.Is(err, ErrLineTooLong) || n != 3 || !strings.Contains(err.Error(), "line 3") {
		t.Fatalf("a line over the bound: line %d, %v", n, err)
	}
	if _, _, again := l.Next(); again == nil || again.Error() != err.Error() {
		t.Errorf("after the error: %v, want it again", again)
	}
}

// TestReadEvents: events in order with their bytes, a bad line named by
// its number (blank lines counted) with the decoder's error, and fn's
// false stopping the read.
func TestReadEvents(t *testing.T) {
	good := `{"call_id":"A","sections":{"S":["One."]}}`
	in := good + "\n\n" + strings.Replace(good, `"A"`, `"B"`, 1) + "\n{bad\n"
	var ids []string
	err := ReadEvents(strings.NewReader(in), DefaultLimits(), 0, func(ev TranscriptEvent, raw []byte) bool {
		ids = append(ids, ev.CallID)
		if ev.CallID == "A" && string(raw) != good {
			t.Errorf("raw %q, want %q", raw, good)
		}
		return true
	})
	var de *DecodeError
	if !errors.As(err, &de) || !strings.HasPrefix(err.Error(), "line 4: ") {
		t.Fatalf("a bad line 4: %v", err)
	}
	if strings.Join(ids, ",") != "A,B" {
		t.Errorf("events %v before the bad line, want A,B", ids)
	}
	ids = nil
	err = ReadEvents(strings.NewReader(in), DefaultLimits(), 0, func(ev TranscriptEvent, _ []byte) bool {
		ids = append(ids, ev.CallID)
		return false
	})
	if err != nil || len(ids) != 1 {
		t.Errorf("stopped after the first: %v, %v", ids, err)
	}
}
