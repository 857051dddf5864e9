package schema

// W3C Trace Context (https://www.w3.org/TR/trace-context/) as Kafka record
// headers, the names OpenTelemetry's Kafka instrumentations read and
// write. The scorer takes no part in a trace (it exports no spans): it
// passes an input record's context on, unchanged, to what it writes for
// that record, so the consumer of a result or dead letter continues the
// producer's trace as if the scorer were a queue between them.
const (
	HeaderTraceParent = "traceparent"
	HeaderTraceState  = "tracestate"
	// MaxTraceHeaderBytes bounds each trace header passed on; a longer one
	// is dropped whole rather than cut (a cut tracestate could end inside a
	// vendor's entry). A traceparent is 55 bytes, and W3C asks that at least
	// 512 characters of tracestate be passed on. The output topics are sized
	// with both headers at this bound.
	MaxTraceHeaderBytes = 8 << 10
)

// TraceContext returns the trace headers of hs to pass on: the first
// traceparent and the first tracestate, in that order, each only when at
// most MaxTraceHeaderBytes (readers take the first of a name). A
// tracestate without a traceparent is dropped, as W3C says a receiver
// must. nil when there is none.
func TraceContext(hs []Header) []Header {
	var parent, state *Header
	for i := range hs {
		h := &hs[i]
		switch {
		case h.Key == HeaderTraceParent && parent == nil:
			parent = h
		case h.Key == HeaderTraceState && state == nil:
			state = h
		}
	}
	if parent == nil || len(parent.Value) > MaxTraceHeaderBytes {
		return nil
	}
	out := []Header{*parent}
	if state != nil && len(state.Value) <= MaxTraceHeaderBytes {
		out = append(out, *state)
	}
	return out
}
