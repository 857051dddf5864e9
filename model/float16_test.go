package model

import (
	"math"
	"testing"

	"github.com/scorer/scorer/internal/onnxfp16"
)

// Every one of the 65,536 float16 values widens to the float32 of the same
// value: checked against the definition (sign · mantissa · 2^exponent,
// subnormals without the implicit bit), and back through the encoder.
func TestFloat16ToFloat32Exhaustive(t *testing.T) {
	for i := range 1 << 16 {
		h := uint16(i)
		got := float16ToFloat32(h)
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

// The encoder rounds to nearest even, saturates to Inf past the largest
// float16 and flushes what is below half the smallest subnormal to zero.
func TestFloat16BitsRounding(t *testing.T) {
	for _, c := range []struct {
		in   float32
		want uint16
	}{
		{1, 0x3c00}, {-2, 0xc000}, {65504, 0x7bff}, {65520, 0x7c00}, {65519, 0x7bff},
		{1 + 1.0/2048, 0x3c00}, {1 + 3.0/2048, 0x3c02}, // ties to even
		{float32(math.Ldexp(1, -24)), 0x0001}, {float32(math.Ldexp(1, -25)), 0x0000}, {float32(math.Ldexp(1.5, -25)), 0x0001},
		{float32(math.Ldexp(1, -14)), 0x0400}, {float32(math.Ldexp(1023, -24)), 0x03ff},
		{float32(math.Inf(-1)), 0xfc00}, {-3.4e38, 0xfc00},
	} {
		if got := onnxfp16.Float16Bits(c.in); got != c.want {
			t.Errorf("Float16Bits(%v) = %#04x, want %#04x", c.in, got, c.want)
		}
	}
}
