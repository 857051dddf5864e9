package onnxgraph_test

import (
	"math"
	"testing"

	"github.com/scorer/scorer/internal/onnxfp16"
	"github.com/scorer/scorer/model/onnxgraph"
)

// Every one of the 65,536 float16 values widens to the float32 of the same
// value: checked against the definition (sign · mantissa · 2^exponent,
// subnormals without the implicit bit), and back through the encoder.
func TestFloat16ToFloat32Exhaustive(t *testing.T) {
	for i := range 1 << 16 {
		h := uint16(i)
		got := onnxgraph.Float16ToFloat32(h)
		sign := 1.0
		if h&0x8000 != 0 {
			sign = -1
		}
		exp, mant := int(h>>10)&0x1f, float64(h&0x3ff)
		var want float64
		switch {
		case exp == 0x1f && mant == 0:
			want = math.Inf(int(sign))
		case exp == 0x1f:
			if !math.IsNaN(float64(got)) {
				t.Fatalf("%#04x: got %v, want NaN", h, got)
			}
			if b := math.Float32bits(got); b>>31 != uint32(h>>15) || (b>>13)&0x3ff != uint32(h&0x3ff) {
				t.Errorf("%#04x: NaN became %#08x, sign or payload lost", h, b)
			}
			continue
		case exp == 0:
			want = sign * math.Ldexp(mant, -24)
		default:
			want = sign * math.Ldexp(1024+mant, exp-25)
		}
		if float64(got) != want || math.Signbit(float64(got)) != (sign < 0) {
			t.Fatalf("%#04x: got %v, want %v", h, got, want)
		}
		if back := onnxfp16.Float16Bits(got); back != h {
			t.Errorf("%#04x → %v → %#04x: the round trip changed it", h, got, back)
		}
	}
}
