package model

import (
	"math"
	"testing"

	"github.com/scorer/scorer/internal/onnxfp16"
)

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
