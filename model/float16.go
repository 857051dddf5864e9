package model

import (
	"encoding/binary"

	"github.com/scorer/scorer/model/onnxgraph"
)

// float16sToFloat32 converts little-endian float16 data (ORT's layout).
func float16sToFloat32(raw []byte) []float32 {
	out := make([]float32, len(raw)/2)
	for i := range out {
		out[i] = onnxgraph.Float16ToFloat32(binary.LittleEndian.Uint16(raw[2*i:]))
	}
	return out
}
