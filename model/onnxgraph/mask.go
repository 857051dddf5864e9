package onnxgraph

import (
	"errors"
	"fmt"
	"slices"

	"google.golang.org/protobuf/proto"

	"github.com/scorer/scorer/model/onnxpb"
)

// DeBERTa's XSoftmax masks each layer's attention scores twice:
//
//	Where(rmask, lowest, scores) → Softmax → Where(rmask, 0, probs)
//
// (the dynamo exporter drops the second Where), where rmask is the
// [batch, 1, L, L] outer product of the padding mask, the same in every
// layer. On a GPU the two Wheres took 10.7% of the kernel time
// (gpu-evidence/2026-11-27/ncu): two full passes over [batch, heads, L, L]
// per layer. rewriteMask replaces them by
//
//	Softmax(scores + bias)
//
// with bias = (keyValid − 1)·10⁴, [batch, 1, 1, L], built once per run from
// rmask: keyValid is 1 for a key some query may attend to (a real token).
// A real query row gets the same probabilities (exp(−10⁴) is 0 in float32
// and float16 alike). A padded query row now attends to the real keys
// instead of being zeroed; nothing real reads it: keys and values at a
// padded position are masked out of every real row, and the classifier
// reads position 0. A key-only mask also never masks a whole row, so no
// row's softmax sees only −∞ (which an additive lowest-float mask could
// make NaN in float16).

// maskBias is the additive key-padding bias, in score units.
const maskBias = 1e4

// errNoMaskedSoftmax is rewriteMask's answer for a graph without the
// pattern.
var errNoMaskedSoftmax = errors.New("no masked softmax found")

// maskSite is one matched masked softmax: pre = Where(rmask, fill, scores),
// softmax, and post = Where(rmask, 0, probs) or nil.
type maskSite struct {
	pre, softmax, post *onnxpb.NodeProto
	dtype              int32
}

// MaskStats counts what rewriteMask changed.
type MaskStats struct{ Softmaxes, Masks int }

func (s MaskStats) String() string {
	return fmt.Sprintf("%d masked softmaxes share %d additive key masks", s.Softmaxes, s.Masks)
}

// matchMask matches the pattern at a Softmax node; sigs tells whether the
// two Wheres read the same mask (exporters may cast it twice).
func (x *Index) matchMask(sm *onnxpb.NodeProto, sigs *signer) (maskSite, bool) {
	s := maskSite{softmax: sm}
	if sm.GetOpType() != "Softmax" || sm.GetDomain() != "" || len(sm.GetInput()) != 1 {
		return s, false
	}
	if ax := attrInt(sm, "axis", -1); ax != -1 && ax != 3 {
		return s, false
	}
	in := sm.GetInput()[0]
	if s.pre = x.Op(in, "Where"); s.pre == nil || x.only(in) != sm {
		return s, false
	}
	fill := x.constTensor(s.pre.GetInput()[1])
	if fill == nil {
		return s, false
	}
	s.dtype = fill.GetDataType()
	if s.dtype != int32(onnxpb.TensorProto_FLOAT) && s.dtype != int32(onnxpb.TensorProto_FLOAT16) {
		return s, false
	}
	if post := x.only(sm.GetOutput()[0]); post != nil && post.GetOpType() == "Where" && post.GetDomain() == "" &&
		sigs.of(post.GetInput()[0]) == sigs.of(s.pre.GetInput()[0]) && post.GetInput()[2] == sm.GetOutput()[0] && x.constTensor(post.GetInput()[1]) != nil {
		s.post = post
	}
	return s, true
}

// rewriteMask rewrites g in place (see above); a graph without the pattern
// comes back untouched with errNoMaskedSoftmax.
func rewriteMask(g *onnxpb.GraphProto, opset int64) (MaskStats, error) {
	var st MaskStats
	x := NewIndex(g)
	sigs := newSigner(g)
	var sites []maskSite
	for _, n := range g.GetNode() {
		if s, ok := x.matchMask(n, sigs); ok {
			sites = append(sites, s)
		}
	}
	if len(sites) == 0 {
		return st, errNoMaskedSoftmax
	}
	if opset < relAttnMinOpset {
		return st, fmt.Errorf("opset %d is older than %d", opset, relAttnMinOpset)
	}
	b := &graphBuilder{prefix: uniquePrefix(x, relAttnPrefix+"_mask")}
	biases := map[string]string{}
	replaced := map[*onnxpb.NodeProto]bool{}
	for _, s := range sites {
		rmask := s.pre.GetInput()[0]
		key := fmt.Sprint(sigs.of(rmask), s.dtype)
		bias, ok := biases[key]
		if !ok {
			bias = b.keyMaskBias(rmask, s.dtype, opset)
			biases[key] = bias
		}
		out := s.softmax.GetOutput()
		if s.post != nil {
			out = s.post.GetOutput()
			replaced[s.post] = true
		}
		sum := b.node("Add", []string{s.pre.GetInput()[2], bias}, nil)
		b.nodes = append(b.nodes, &onnxpb.NodeProto{OpType: proto.String("Softmax"), Name: proto.String(b.name("Softmax")),
			Input: []string{sum}, Output: slices.Clone(out), Attribute: s.softmax.GetAttribute()})
		replaced[s.pre], replaced[s.softmax] = true, true
	}
	st.Softmaxes, st.Masks = len(sites), len(biases)
	g.Node = slices.DeleteFunc(g.Node, func(n *onnxpb.NodeProto) bool { return replaced[n] })
	g.Node = append(g.Node, b.nodes...)
	g.Initializer = append(g.Initializer, b.inits...)
	pruneDead(g)
	return st, sortTopologically(g)
}

// keyMaskBias builds (max over queries of ¬rmask − 1)·10⁴ as dtype.
func (b *graphBuilder) keyMaskBias(rmask string, dtype int32, opset int64) string {
	valid := b.node("Cast", []string{b.node("Not", []string{rmask}, nil)}, []*onnxpb.AttributeProto{intAttr("to", int64(onnxpb.TensorProto_FLOAT))})
	// ReduceMax took its axes as an attribute until opset 18.
	var keyValid string
	if opset < 18 {
		keyValid = b.node("ReduceMax", []string{valid}, []*onnxpb.AttributeProto{intsAttr("axes", -2), intAttr("keepdims", 1)})
	} else {
		keyValid = b.node("ReduceMax", []string{valid, b.ints([]int64{1}, -2)}, []*onnxpb.AttributeProto{intAttr("keepdims", 1)})
	}
	bias := b.node("Mul", []string{b.node("Sub", []string{keyValid, b.float(1)}, nil), b.float(maskBias)}, nil)
	if dtype != int32(onnxpb.TensorProto_FLOAT) {
		bias = b.node("Cast", []string{bias}, []*onnxpb.AttributeProto{intAttr("to", int64(dtype))})
	}
	return bias
}
