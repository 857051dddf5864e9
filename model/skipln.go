package model

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"

	"google.golang.org/protobuf/proto"

	"github.com/scorer/scorer/model/onnxpb"
)

// Every DeBERTa layer ends its attention block and its feed-forward block
// with LayerNorm(dense(h) + bias + residual). The TorchScript exporter
// writes the LayerNorm as eleven ops (ReduceMean, Sub, Pow, ReduceMean,
// Add ε, Sqrt, Div, Mul γ, Add β), the dynamo exporter as one
// LayerNormalization; ONNX Runtime fuses both into LayerNormalization but
// leaves the two Adds before it apart (its SkipLayerNorm fusion wants
// shapes the dynamic graph does not state), so on a GPU every residual
// block costs three passes over [batch, L, hidden] where one would do:
// Add 15.3% and LayerNorm 4.2% of the kernel time on an H200
// (gpu-evidence/2026-11-27/ncu). rewriteSkipLayerNorm writes each as ONNX
// Runtime's SkipLayerNormalization (com.microsoft; CPU and CUDA kernels):
//
//	SkipLayerNormalization(dense(h), residual, γ, β, bias, epsilon=ε)
//
// which adds, normalises and scales in one kernel.

// msDomain is ONNX Runtime's contrib-op domain.
const msDomain = "com.microsoft"

var errNoSkipLayerNorm = errors.New("no residual LayerNorm found")

// skipLNStats counts what rewriteSkipLayerNorm changed.
type skipLNStats struct{ Fused, WithBias int }

func (s skipLNStats) String() string {
	return fmt.Sprintf("%d residual LayerNorms fused (%d with their bias)", s.Fused, s.WithBias)
}

// lnSite is one LayerNorm over Add(a, b): the nodes it replaces, its
// inputs and ε.
type lnSite struct {
	nodes             []*onnxpb.NodeProto
	input, skip, bias string
	gamma, beta, out  string
	eps               float32
}

// matchLN matches a LayerNorm ending at n: LayerNormalization over the last
// axis, or the eleven-op form ending in Add β.
func (x *graphIndex) matchLN(n *onnxpb.NodeProto) (lnSite, string, bool) {
	var s lnSite
	if n.GetDomain() != "" {
		return s, "", false
	}
	if n.GetOpType() == "LayerNormalization" {
		if len(n.GetInput()) != 3 || len(n.GetOutput()) != 1 || attrInt(n, "axis", -1) != -1 {
			return s, "", false
		}
		s.eps = 1e-5
		for _, a := range n.GetAttribute() {
			if a.GetName() == "epsilon" {
				s.eps = a.GetF()
			}
		}
		s.nodes, s.gamma, s.beta, s.out = []*onnxpb.NodeProto{n}, n.GetInput()[1], n.GetInput()[2], n.GetOutput()[0]
		return s, n.GetInput()[0], true
	}
	if n.GetOpType() != "Add" {
		return s, "", false
	}
	mul, beta := x.operand(n, "Mul")
	if mul == nil {
		return s, "", false
	}
	div, gamma := x.operand(mul, "Div")
	if div == nil {
		return s, "", false
	}
	sub, sqrt := x.op(div.GetInput()[0], "Sub"), x.op(div.GetInput()[1], "Sqrt")
	if sub == nil || sqrt == nil {
		return s, "", false
	}
	addEps := x.op(sqrt.GetInput()[0], "Add")
	if addEps == nil {
		return s, "", false
	}
	rmVar, epsName := x.operand(addEps, "ReduceMean")
	if rmVar == nil {
		return s, "", false
	}
	pow := x.op(rmVar.GetInput()[0], "Pow")
	rmMean := x.op(sub.GetInput()[1], "ReduceMean")
	if pow == nil || rmMean == nil || pow.GetInput()[0] != sub.GetOutput()[0] || rmMean.GetInput()[0] != sub.GetInput()[0] {
		return s, "", false
	}
	if two, ok := x.constFloat(pow.GetInput()[1]); !ok || two != 2 {
		return s, "", false
	}
	eps, ok := x.constFloat(epsName)
	if !ok || !x.lastAxis(rmMean) || !x.lastAxis(rmVar) {
		return s, "", false
	}
	s.nodes = []*onnxpb.NodeProto{rmMean, sub, pow, rmVar, addEps, sqrt, div, mul, n}
	// Each intermediate is read inside the pattern only.
	inside := map[*onnxpb.NodeProto]bool{}
	for _, m := range s.nodes {
		inside[m] = true
	}
	for _, m := range s.nodes[:len(s.nodes)-1] {
		for _, c := range x.consumers[m.GetOutput()[0]] {
			if !inside[c] || x.outputs[m.GetOutput()[0]] {
				return s, "", false
			}
		}
	}
	s.gamma, s.beta, s.out, s.eps = gamma, beta, n.GetOutput()[0], eps
	return s, sub.GetInput()[0], true
}

// operand is n's input produced by an opType node (either input of a
// binary op) and the other input.
func (x *graphIndex) operand(n *onnxpb.NodeProto, opType string) (*onnxpb.NodeProto, string) {
	if len(n.GetInput()) != 2 {
		return nil, ""
	}
	for i, in := range n.GetInput() {
		if p := x.op(in, opType); p != nil {
			return p, n.GetInput()[1-i]
		}
	}
	return nil, ""
}

// lastAxis reports whether a ReduceMean averages over the last axis only.
func (x *graphIndex) lastAxis(n *onnxpb.NodeProto) bool {
	axes := []int64(nil)
	for _, a := range n.GetAttribute() {
		if a.GetName() == "axes" {
			axes = a.GetInts()
		}
	}
	if len(n.GetInput()) > 1 {
		axes, _ = x.constInts(n.GetInput()[1])
	}
	return slices.Equal(axes, []int64{-1})
}

// constFloat is the value of a one-element float32 or float16 constant.
func (x *graphIndex) constFloat(name string) (float32, bool) {
	t := x.constTensor(name)
	if t == nil {
		return 0, false
	}
	switch onnxpb.TensorProto_DataType(t.GetDataType()) {
	case onnxpb.TensorProto_FLOAT:
		if v := t.GetFloatData(); len(v) == 1 {
			return v[0], true
		}
		if raw := t.GetRawData(); len(raw) == 4 {
			return math.Float32frombits(binary.LittleEndian.Uint32(raw)), true
		}
	case onnxpb.TensorProto_FLOAT16:
		// float16 values travel in int32_data, one per element, or raw.
		if v := t.GetInt32Data(); len(v) == 1 {
			return float16ToFloat32(uint16(v[0])), true
		}
		if raw := t.GetRawData(); len(raw) == 2 {
			return float16ToFloat32(binary.LittleEndian.Uint16(raw)), true
		}
	}
	return 0, false
}

// vector reports whether name is a one-dimensional initializer, or an
// Identity of one (TorchScript shares weights so).
func (x *graphIndex) vector(name string) bool {
	for range 4 {
		if t := x.inits[name]; t != nil {
			return len(t.GetDims()) == 1
		}
		n := x.op(name, "Identity")
		if n == nil {
			return false
		}
		name = n.GetInput()[0]
	}
	return false
}

// rewriteSkipLayerNorm rewrites m's graph in place (see above), adding the
// com.microsoft opset it uses; a graph without the pattern comes back
// untouched with errNoSkipLayerNorm.
func rewriteSkipLayerNorm(m *onnxpb.ModelProto) (skipLNStats, error) {
	var st skipLNStats
	g := m.GetGraph()
	x := indexGraph(g)
	b := &graphBuilder{prefix: uniquePrefix(x, relAttnPrefix+"_skipln")}
	replaced := map[*onnxpb.NodeProto]bool{}
	for _, n := range g.GetNode() {
		s, in, ok := x.matchLN(n)
		if !ok || !x.vector(s.gamma) || !x.vector(s.beta) {
			continue
		}
		sum := x.op(in, "Add")
		if sum == nil || replaced[sum] || x.outputs[in] || len(x.consumers[in]) != consumersIn(x, in, s.nodes) {
			continue
		}
		s.input, s.skip = sum.GetInput()[0], sum.GetInput()[1]
		// The dense side is Add(bias, MatMul) read only here: its bias
		// goes into the fused kernel.
		for i, side := range sum.GetInput() {
			dense := x.op(side, "Add")
			if dense == nil || x.only(side) != sum {
				continue
			}
			mm, bias := x.operand(dense, "MatMul")
			if mm == nil || !x.vector(bias) {
				continue
			}
			s.input, s.skip, s.bias = mm.GetOutput()[0], sum.GetInput()[1-i], bias
			s.nodes = append(s.nodes, dense)
			break
		}
		s.nodes = append(s.nodes, sum)
		inputs := []string{s.input, s.skip, s.gamma, s.beta}
		if s.bias != "" {
			inputs = append(inputs, s.bias)
			st.WithBias++
		}
		b.nodes = append(b.nodes, &onnxpb.NodeProto{OpType: proto.String("SkipLayerNormalization"), Domain: proto.String(msDomain),
			Name: proto.String(b.name("SkipLayerNormalization")), Input: inputs, Output: []string{s.out},
			Attribute: []*onnxpb.AttributeProto{{Name: proto.String("epsilon"), Type: onnxpb.AttributeProto_FLOAT.Enum(), F: proto.Float32(s.eps)}}})
		for _, r := range s.nodes {
			replaced[r] = true
		}
		st.Fused++
	}
	if st.Fused == 0 {
		return st, errNoSkipLayerNorm
	}
	g.Node = slices.DeleteFunc(g.Node, func(n *onnxpb.NodeProto) bool { return replaced[n] })
	g.Node = append(g.Node, b.nodes...)
	ensureOpset(m, msDomain, 1)
	pruneDead(g)
	return st, sortTopologically(g)
}

// consumersIn counts name's readers among nodes.
func consumersIn(x *graphIndex, name string, nodes []*onnxpb.NodeProto) int {
	n := 0
	for _, c := range x.consumers[name] {
		if slices.Contains(nodes, c) {
			n++
		}
	}
	return n
}

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
