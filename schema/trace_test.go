package schema

import (
	"slices"
	"strings"
	"testing"
)

// TestTraceContext: the first traceparent and the first tracestate are
// passed on, in that order, whatever else the record carries; one over
// MaxTraceHeaderBytes is dropped whole, and a tracestate without a
// traceparent is dropped.
func TestTraceContext(t *testing.T) {
	h := func(k, v string) Header { return Header{Key: k, Value: []byte(v)} }
	long := strings.Repeat("a", MaxTraceHeaderBytes+1)
	fits := strings.Repeat("a", MaxTraceHeaderBytes)
	for _, tc := range []struct {
		name     string
		in, want []Header
	}{
		{"none", []Header{h("origin", "x")}, nil},
		{"both, state first", []Header{h("tracestate", "s1"), h("origin", "x"), h("traceparent", "p1")},
			[]Header{h("traceparent", "p1"), h("tracestate", "s1")}},
		{"the first of each", []Header{h("traceparent", "p1"), h("traceparent", "p2"), h("tracestate", "s1"), h("tracestate", "s2")},
			[]Header{h("traceparent", "p1"), h("tracestate", "s1")}},
		{"state alone", []Header{h("tracestate", "s1")}, nil},
		{"parent too long", []Header{h("traceparent", long), h("tracestate", "s1")}, nil},
		{"state too long", []Header{h("traceparent", "p1"), h("tracestate", long)}, []Header{h("traceparent", "p1")}},
		{"state at the bound", []Header{h("traceparent", "p1"), h("tracestate", fits)}, []Header{h("traceparent", "p1"), h("tracestate", fits)}},
	} {
		got := TraceContext(tc.in)
		if !slices.EqualFunc(got, tc.want, func(a, b Header) bool { return a.Key == b.Key && string(a.Value) == string(b.Value) }) {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}
