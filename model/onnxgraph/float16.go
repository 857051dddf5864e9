package onnxgraph

import "math"

// Float16ToFloat32 widens an IEEE 754 binary16 value exactly: every float16
// (subnormals, ±0, ±Inf, NaN with its payload's top bits) is a float32.
// The rewrites read float16 constants with it; model reads float16 outputs.
func Float16ToFloat32(h uint16) float32 {
	sign := uint32(h&0x8000) << 16
	exp := uint32(h>>10) & 0x1f
	mant := uint32(h & 0x3ff)
	switch {
	case exp == 0x1f: // Inf or NaN: keep the payload, quiet or not
		return math.Float32frombits(sign | 0x7f800000 | mant<<13)
	case exp == 0 && mant == 0:
		return math.Float32frombits(sign)
	case exp == 0:
		// Subnormal: mant·2⁻²⁴. Normalise: shift until the implicit bit
		// shows, lowering the exponent once per shift.
		e := uint32(127 - 15 + 1)
		for mant&0x400 == 0 {
			mant <<= 1
			e--
		}
		return math.Float32frombits(sign | e<<23 | (mant&0x3ff)<<13)
	}
	return math.Float32frombits(sign | (exp+127-15)<<23 | mant<<13)
}
