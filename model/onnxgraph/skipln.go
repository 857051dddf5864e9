package onnxgraph

import (
	"errors"
	"fmt"
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

var errNoSkipLayerNorm = errors.New("no residual LayerNorm found")

// SkipLNStats counts what rewriteSkipLayerNorm changed.
type SkipLNStats struct{ Fused, WithBias int }

func (s SkipLNStats) String() string {
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
func (x *Index) matchLN(n *onnxpb.NodeProto) (lnSite, string, bool) {
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
	sub, sqrt := x.Op(div.GetInput()[0], "Sub"), x.Op(div.GetInput()[1], "Sqrt")
	if sub == nil || sqrt == nil {
		return s, "", false
	}
	addEps := x.Op(sqrt.GetInput()[0], "Add")
	if addEps == nil {
		return s, "", false
	}
	rmVar, epsName := x.operand(addEps, "ReduceMean")
	if rmVar == nil {
		return s, "", false
	}
	pow := x.Op(rmVar.GetInput()[0], "Pow")
	rmMean := x.Op(sub.GetInput()[1], "ReduceMean")
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

// rewriteSkipLayerNorm rewrites m's graph in place (see above), adding the
// com.microsoft opset it uses; a graph without the pattern comes back
// untouched with errNoSkipLayerNorm.
func rewriteSkipLayerNorm(m *onnxpb.ModelProto) (SkipLNStats, error) {
	var st SkipLNStats
	g := m.GetGraph()
	x := NewIndex(g)
	b := &graphBuilder{prefix: uniquePrefix(x, relAttnPrefix+"_skipln")}
	replaced := map[*onnxpb.NodeProto]bool{}
	for _, n := range g.GetNode() {
		s, in, ok := x.matchLN(n)
		if !ok || !x.vector(s.gamma) || !x.vector(s.beta) {
			continue
		}
		sum := x.Op(in, "Add")
		if sum == nil || replaced[sum] || x.outputs[in] || len(x.consumers[in]) != consumersIn(x, in, s.nodes) {
			continue
		}
		s.input, s.skip = sum.GetInput()[0], sum.GetInput()[1]
		// The dense side is Add(bias, MatMul) read only here: its bias
		// goes into the fused kernel.
		for i, side := range sum.GetInput() {
			dense := x.Op(side, "Add")
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
func consumersIn(x *Index, name string, nodes []*onnxpb.NodeProto) int {
	n := 0
	for _, c := range x.consumers[name] {
		if slices.Contains(nodes, c) {
			n++
		}
	}
	return n
}
