package onnxgraph

import (
	"fmt"
	"strings"

	"google.golang.org/protobuf/proto"

	"github.com/scorer/scorer/model/onnxpb"
)

// uniquePrefix is base, or base with a number, that no tensor or node name
// of the graph starts with.
func uniquePrefix(x *Index, base string) string {
	used := func(p string) bool {
		for name := range x.producer {
			if strings.HasPrefix(name, p) {
				return true
			}
		}
		for name := range x.inits {
			if strings.HasPrefix(name, p) {
				return true
			}
		}
		return false
	}
	p := base + "/"
	for i := 2; used(p); i++ {
		p = fmt.Sprintf("%s%d/", base, i)
	}
	return p
}

// graphBuilder appends nodes and int64 constants under one name prefix.
type graphBuilder struct {
	prefix string
	n      int
	nodes  []*onnxpb.NodeProto
	inits  []*onnxpb.TensorProto
	consts map[string]string
}

func (b *graphBuilder) name(what string) string {
	b.n++
	return fmt.Sprintf("%s%s_%d", b.prefix, what, b.n)
}

// node adds a single-output node and returns its output's name.
func (b *graphBuilder) node(op string, inputs []string, attrs []*onnxpb.AttributeProto) string {
	out := b.name(op)
	b.nodes = append(b.nodes, &onnxpb.NodeProto{OpType: proto.String(op), Name: proto.String(out), Input: inputs, Output: []string{out}, Attribute: attrs})
	return out
}

// ints is an int64 initializer holding v, with dims (nil: a scalar).
func (b *graphBuilder) ints(dims []int64, v ...int64) string {
	key := fmt.Sprint(dims, v)
	if name, ok := b.consts[key]; ok {
		return name
	}
	if b.consts == nil {
		b.consts = map[string]string{}
	}
	name := b.name("const")
	b.inits = append(b.inits, &onnxpb.TensorProto{Name: proto.String(name), Dims: dims, DataType: proto.Int32(int32(onnxpb.TensorProto_INT64)), Int64Data: v})
	b.consts[key] = name
	return name
}

// float is a float32 scalar initializer holding v.
func (b *graphBuilder) float(v float32) string {
	name := b.name("const")
	b.inits = append(b.inits, &onnxpb.TensorProto{Name: proto.String(name), DataType: proto.Int32(int32(onnxpb.TensorProto_FLOAT)), FloatData: []float32{v}})
	return name
}

func intAttr(name string, v int64) *onnxpb.AttributeProto {
	return &onnxpb.AttributeProto{Name: proto.String(name), Type: onnxpb.AttributeProto_INT.Enum(), I: proto.Int64(v)}
}

func intsAttr(name string, v ...int64) *onnxpb.AttributeProto {
	return &onnxpb.AttributeProto{Name: proto.String(name), Type: onnxpb.AttributeProto_INTS.Enum(), Ints: v}
}

// msDomain is ONNX Runtime's contrib-op domain.
const msDomain = "com.microsoft"

// ensureOpset imports domain at version at least v.
func ensureOpset(m *onnxpb.ModelProto, domain string, v int64) {
	for _, o := range m.GetOpsetImport() {
		if o.GetDomain() == domain {
			if o.GetVersion() < v {
				o.Version = proto.Int64(v)
			}
			return
		}
	}
	m.OpsetImport = append(m.OpsetImport, &onnxpb.OperatorSetIdProto{Domain: proto.String(domain), Version: proto.Int64(v)})
}

// defaultOpset is the model's default-domain ("" or "ai.onnx") opset.
func defaultOpset(m *onnxpb.ModelProto) int64 {
	for _, o := range m.GetOpsetImport() {
		if o.GetDomain() == "" || o.GetDomain() == "ai.onnx" {
			return o.GetVersion()
		}
	}
	return 0
}
