package schema

import (
	"errors"
	"fmt"
	"runtime"
	"strings"
	"testing"
)

// decodeAllocs decodes data once and returns the bytes allocated meanwhile
// (runtime.MemStats.TotalAlloc, which counts every allocation whether or
// not it was freed since) and the decode error.
func decodeAllocs(data []byte, lim Limits) (uint64, error) {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	_, err := DecodeEvent(data, lim)
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc, err
}

// TestRejectedRecordCostsAboutItsSize: a record over the sentence limit is
// rejected having allocated a small multiple of its own size, however its
// sentences are spread: many sections each under the limit, or Python list
// literals that the list parser would otherwise expand in full. Before the
// budget was passed down, the 64-section record allocated 98 times its size
// (1.6 GB: each section decoded in full, the total checked last) and the
// Python-list one 32 times; now about 3.5 and 2.3 times (the record's
// fields, its sections and the sentences of the section that crosses the
// limit are each held once).
func TestRejectedRecordCostsAboutItsSize(t *testing.T) {
	if testing.Short() {
		t.Skip("builds 16 MiB records")
	}
	// MAX_MESSAGE_BYTES raised to 16 MiB, as a deployment may.
	lim := DefaultLimits()
	lim.MaxMessageBytes = 16 << 20
	sections := func(n, per int) []byte {
		var b strings.Builder
		b.WriteString(`{"call_id":"x","sections":{`)
		empties := strings.TrimSuffix(strings.Repeat(`"",`, per), ",")
		for i := range n {
			if i > 0 {
				b.WriteByte(',')
			}
			fmt.Fprintf(&b, `"S%02d":[%s]`, i, empties)
		}
		b.WriteString(`}}`)
		return []byte(b.String())
	}
	python := func(per int) []byte {
		lit := "[" + strings.TrimSuffix(strings.Repeat(`'', `, per), ", ") + "]"
		return []byte(`{"CALL_ID":"x","FILT_MD":"` + lit + `","FILT_QA":"` + lit + `"}`)
	}
	for _, tc := range []struct {
		name string
		data []byte
	}{
		// 64 sections of 87,000 empty sentences: every section is within
		// MAX_SENTENCES, the record within MAX_MESSAGE_BYTES.
		{"64 sections each under the limit", sections(64, 87_000)},
		// Two seed columns holding 1.5 million empty Python strings each.
		{"python lists", python(1_500_000)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if len(tc.data) > lim.MaxMessageBytes {
				t.Fatalf("test record is %d bytes, over MaxMessageBytes %d", len(tc.data), lim.MaxMessageBytes)
			}
			alloc, err := decodeAllocs(tc.data, lim)
			var de *DecodeError
			if !errors.As(err, &de) || de.Reason != ReasonTooLarge {
				t.Fatalf("DecodeEvent = %v, want too_large", err)
			}
			ratio := float64(alloc) / float64(len(tc.data))
			t.Logf("%d-byte record: %d bytes allocated (%.1f× its size) before %v", len(tc.data), alloc, ratio, err)
			if ratio > 5 {
				t.Errorf("rejecting a %d-byte record allocated %d bytes, %.1f× its size; want at most 5×", len(tc.data), alloc, ratio)
			}
		})
	}
}
