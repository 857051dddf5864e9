package schema

import (
	"errors"
	"reflect"
	"testing"
)

func TestParsePythonList(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want []string
	}{
		{"empty", "[]", []string{}},
		{"spaces", "  [ ]  ", []string{}},
		{"single quotes", `['a', 'b']`, []string{"a", "b"}},
		{"double quotes with apostrophe", `['a', "b's"]`, []string{"a", "b's"}},
		{"escaped quote", `['it\'s', "say \"hi\""]`, []string{"it's", `say "hi"`}},
		{"backslash", `['a\\b']`, []string{`a\b`}},
		{"control escapes", `['\n\t\r\a\b\f\v']`, []string{"\n\t\r\a\b\f\v"}},
		{"hex", `['\x41\xe9']`, []string{"Aé"}},
		{"u16", `['\u00e9\u2019']`, []string{"é\u2019"}},
		{"u32", `['\U0001F600']`, []string{"😀"}},
		{"octal", `['\101\0']`, []string{"A\x00"}},
		{"unknown escape kept", `['\q\d']`, []string{`\q\d`}},
		{"line continuation", "['a\\\nb']", []string{"ab"}},
		{"trailing comma", `['a', 'b',]`, []string{"a", "b"}},
		{"adjacent concat", `['a' "b" 'c', 'd']`, []string{"abc", "d"}},
		{"prefixes", `[u'a', r'\n', R"x\"y", U'z']`, []string{"a", `\n`, `x\"y`, "z"}},
		{"triple quoted", `['''a'b
c''', """d"""]`, []string{"a'b\nc", "d"}},
		{"empty strings", `['', ""]`, []string{"", ""}},
		{"utf8 raw", `['café — ok']`, []string{"café — ok"}},
		{"newlines between", "[\n 'a',\n 'b'\n]\n", []string{"a", "b"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParsePythonList(tc.in)
			if err != nil {
				t.Fatalf("ParsePythonList(%q): %v", tc.in, err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("ParsePythonList(%q) = %q, want %q", tc.in, got, tc.want)
			}
		})
	}
}

func TestParsePythonListErrors(t *testing.T) {
	tests := []struct {
		name string
		in   string
		pos  int
	}{
		{"empty input", "", 0},
		{"not a list", "'a'", 0},
		{"unterminated list", "['a'", 4},
		{"unterminated string", "['a]", 1},
		{"None", "['a', None]", 6},
		{"number", "[1]", 1},
		{"missing comma", "['a' 1]", 5},
		{"trailing junk", "['a'] x", 6},
		{"double comma", "['a',,]", 5},
		{"bad hex", `['\xZZ']`, 2},
		{"truncated u", `['\u12']`, 2},
		{"surrogate", `['\ud800']`, 2},
		{"out of range", `['\U00110000']`, 2},
		{"raw newline", "['a\nb']", 3},
		{"bytes prefix", "[b'a']", 1},
		{"bad prefix", "[ru'a']", 1},
		{"lone backslash", `['\`, 2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParsePythonList(tc.in)
			var pe *PythonListError
			if !errors.As(err, &pe) {
				t.Fatalf("ParsePythonList(%q) = %q, %v; want a *PythonListError", tc.in, got, err)
			}
			if pe.Pos != tc.pos {
				t.Errorf("ParsePythonList(%q): error at %d (%v), want %d", tc.in, pe.Pos, err, tc.pos)
			}
		})
	}
}
