package onnxfp16

import (
	"encoding/binary"
	"fmt"
	"math"

	"google.golang.org/protobuf/proto"

	"github.com/scorer/scorer/model/onnxpb"
)

// constantToFloat16 converts a Constant's or ConstantOfShape's float value.
func (c *converter) constantToFloat16(n *onnxpb.NodeProto) error {
	for _, a := range n.GetAttribute() {
		switch a.GetName() {
		case "value":
			if t := a.GetT(); t != nil && t.GetDataType() == f32 {
				if err := toFloat16(t); err != nil {
					return err
				}
				c.st.Constants++
			}
		case "value_float", "value_floats":
			vals := a.GetFloats()
			dims := []int64{int64(len(vals))}
			if a.GetName() == "value_float" {
				vals, dims = []float32{a.GetF()}, nil
			}
			t := &onnxpb.TensorProto{DataType: proto.Int32(f32), Dims: dims, FloatData: vals}
			if err := toFloat16(t); err != nil {
				return err
			}
			*a = onnxpb.AttributeProto{Name: proto.String("value"), Type: onnxpb.AttributeProto_TENSOR.Enum(), T: t}
			c.st.Constants++
		}
	}
	if n.GetOpType() == "ConstantOfShape" && attr(n, "value") == nil {
		// The default value is a float32 zero; say float16 explicitly.
		t := &onnxpb.TensorProto{DataType: proto.Int32(f16), Dims: []int64{1}, RawData: []byte{0, 0}}
		n.Attribute = append(n.Attribute, &onnxpb.AttributeProto{Name: proto.String("value"), Type: onnxpb.AttributeProto_TENSOR.Enum(), T: t})
		c.st.Constants++
	}
	return nil
}

// toFloat16 rewrites a float32 tensor's data as float16 raw data. Values
// beyond float16's range saturate to ±65504 (exporters write float32's
// lowest as a mask fill; ±Inf would turn a fully masked softmax row into
// NaN); NaN and infinities stay what they are.
func toFloat16(t *onnxpb.TensorProto) error {
	var vals []float32
	switch {
	case len(t.GetRawData()) > 0:
		raw := t.GetRawData()
		if len(raw)%4 != 0 {
			return fmt.Errorf("tensor %s: %d bytes of float32 raw data", t.GetName(), len(raw))
		}
		vals = make([]float32, len(raw)/4)
		for i := range vals {
			vals[i] = math.Float32frombits(binary.LittleEndian.Uint32(raw[4*i:]))
		}
	default:
		vals = t.GetFloatData()
	}
	raw := make([]byte, 2*len(vals))
	for i, v := range vals {
		if !math.IsInf(float64(v), 0) {
			v = max(-65504, min(65504, v))
		}
		binary.LittleEndian.PutUint16(raw[2*i:], Float16Bits(v))
	}
	t.DataType = proto.Int32(f16)
	t.FloatData = nil
	t.RawData = raw
	return nil
}

// Float16Bits is f as an IEEE 754 binary16 bit pattern, rounded to nearest
// even: values past 65504 (after rounding) become ±Inf, tiny ones float16
// subnormals or ±0, NaN a quiet NaN.
func Float16Bits(f float32) uint16 {
	b := math.Float32bits(f)
	sign := uint16(b>>16) & 0x8000
	exp := int32(b>>23) & 0xff
	mant := b & 0x7fffff
	switch {
	case exp == 0xff && mant != 0:
		return sign | 0x7e00
	case exp == 0xff:
		return sign | 0x7c00
	}
	e := exp - 127 + 15
	if e >= 0x1f {
		return sign | 0x7c00
	}
	if e <= 0 {
		// Subnormal (or zero): shift the implicit-one mantissa right.
		if e < -10 {
			return sign
		}
		m := mant | 0x800000
		shift := uint32(14 - e)
		h := m >> shift
		rem := m & (1<<shift - 1)
		half := uint32(1) << (shift - 1)
		if rem > half || (rem == half && h&1 == 1) {
			h++
		}
		return sign | uint16(h)
	}
	h := uint32(e)<<10 | mant>>13
	rem := mant & 0x1fff
	if rem > 0x1000 || (rem == 0x1000 && h&1 == 1) {
		h++ // may carry into the exponent, up to Inf: both are right
	}
	return sign | uint16(h)
}
