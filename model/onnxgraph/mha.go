package onnxgraph

import (
	"errors"
	"fmt"
	"slices"

	"google.golang.org/protobuf/proto"

	"github.com/scorer/scorer/model/onnxpb"
)

// rewriteMHA replaces each layer's attention core, after the other
// rewrites have run, by ONNX Runtime's MultiHeadAttention (com.microsoft),
// which runs QKᵀ, the softmax and ·V as one fused kernel on CUDA:
//
//	context = MultiHeadAttention(Q, K, V, attention_bias = c2p + p2c + mask, num_heads, scale = 1/s)
//
// where Q, K and V are the projections as [batch, L, hidden] (before the
// exporter's per-head Reshape → Transpose → Reshape), c2p and p2c the
// relative-position terms already windowed and scaled (relattn.go), the
// mask the shared additive key mask (mask.go) and s the attention
// scale (when the graph computes it at run time, Q is divided by it and
// scale is 1). The heads come from config.json (num_attention_heads): the
// graph states them only through shapes computed at run time.
//
// It is off by default: on an H200 it won in the shape bench at 48, 128
// and 512 tokens but halved the real transcripts, whose batches have odd
// lengths, where ONNX Runtime's fused attention with a bias falls back to
// its unfused path (docs/gpu.md). The fidelity tests hold it to the same
// 1e-5 as the other steps.

var (
	errNoAttentionCore = errors.New("no attention core found")
	errNoHeads         = errors.New("MultiHeadAttention needs num_attention_heads in config.json")
)

// MHAStats counts what rewriteMHA changed.
type MHAStats struct{ Fused, Heads int }

func (s MHAStats) String() string {
	return fmt.Sprintf("%d attention cores as MultiHeadAttention (%d heads)", s.Fused, s.Heads)
}

// unheads is the [batch, L, hidden] tensor that Reshape(Transpose(Reshape(t,
// [b, L, heads, d]), [0, 2, 1, 3]), [b·heads, L, d]) splits into heads, or "".
func (x *Index) unheads(bh string) string {
	r1 := x.Op(bh, "Reshape")
	if r1 == nil {
		return ""
	}
	tr := x.Op(r1.GetInput()[0], "Transpose")
	if tr == nil || !slices.Equal(permOf(tr), []int64{0, 2, 1, 3}) {
		return ""
	}
	r0 := x.Op(tr.GetInput()[0], "Reshape")
	if r0 == nil {
		return ""
	}
	return r0.GetInput()[0]
}

// addLeaves flattens a tree of Adds each read only inside it.
func (x *Index) addLeaves(name string, top bool) []string {
	n := x.Op(name, "Add")
	if n == nil || (!top && x.only(name) == nil) {
		return []string{name}
	}
	return append(x.addLeaves(n.GetInput()[0], false), x.addLeaves(n.GetInput()[1], false)...)
}

// mhaSite is one matched attention core.
type mhaSite struct {
	q, k, v      string
	scale        string // the divisor of QKᵀ, "" for none
	rel          []string
	shape4, bias string
	out          string
}

// matchMHA matches the core at a Softmax whose input is Add(Reshape(S,
// shape4), bias) (the mask rewrite's form) and whose output reaches the
// context through Reshape → MatMul(·, V) → Reshape → Transpose → Reshape.
func (x *Index) matchMHA(sm *onnxpb.NodeProto) (mhaSite, bool) {
	var s mhaSite
	if sm.GetOpType() != "Softmax" || sm.GetDomain() != "" {
		return s, false
	}
	add := x.Op(sm.GetInput()[0], "Add")
	if add == nil {
		return s, false
	}
	r4, bias := x.operand(add, "Reshape")
	if r4 == nil {
		return s, false
	}
	s.shape4, s.bias = r4.GetInput()[1], bias
	// The context: Reshape → MatMul(·, V) → Reshape → Transpose → Reshape.
	rp := x.data(sm.GetOutput()[0])
	if rp == nil || rp.GetOpType() != "Reshape" {
		return s, false
	}
	mm := x.data(rp.GetOutput()[0])
	if mm == nil || mm.GetOpType() != "MatMul" || mm.GetInput()[0] != rp.GetOutput()[0] {
		return s, false
	}
	if s.v = x.unheads(mm.GetInput()[1]); s.v == "" {
		return s, false
	}
	r1 := x.data(mm.GetOutput()[0])
	if r1 == nil || r1.GetOpType() != "Reshape" {
		return s, false
	}
	tr := x.data(r1.GetOutput()[0])
	if tr == nil || tr.GetOpType() != "Transpose" || !slices.Equal(permOf(tr), []int64{0, 2, 1, 3}) {
		return s, false
	}
	r2 := x.data(tr.GetOutput()[0])
	if r2 == nil || r2.GetOpType() != "Reshape" {
		return s, false
	}
	s.out = r2.GetOutput()[0]
	// The scores: QKᵀ (scaled before or after the product) plus the rest.
	for _, leaf := range x.addLeaves(r4.GetInput()[0], true) {
		if s.q != "" {
			s.rel = append(s.rel, leaf)
			continue
		}
		qk, scale := x.Op(leaf, "MatMul"), ""
		if d := x.Op(leaf, "Div"); d != nil && x.scalar(d.GetInput()[1], 0) {
			qk, scale = x.Op(d.GetInput()[0], "MatMul"), d.GetInput()[1]
		}
		if qk == nil {
			s.rel = append(s.rel, leaf)
			continue
		}
		kt := qk.GetInput()[1]
		if d := x.Op(kt, "Div"); d != nil && scale == "" && x.scalar(d.GetInput()[1], 0) {
			kt, scale = d.GetInput()[0], d.GetInput()[1]
		}
		t := x.Op(kt, "Transpose")
		q := x.unheads(qk.GetInput()[0])
		if t == nil || !slices.Equal(permOf(t), []int64{0, 2, 1}) || q == "" {
			s.rel = append(s.rel, leaf)
			continue
		}
		k := x.unheads(t.GetInput()[0])
		if k == "" {
			s.rel = append(s.rel, leaf)
			continue
		}
		s.q, s.k, s.scale = q, k, scale
	}
	return s, s.q != "" && len(s.rel) > 0
}

// rewriteMHA rewrites m's graph in place (see above).
func rewriteMHA(m *onnxpb.ModelProto, heads int) (MHAStats, error) {
	st := MHAStats{Heads: heads}
	if heads < 1 {
		return st, errNoHeads
	}
	g := m.GetGraph()
	x := NewIndex(g)
	b := &graphBuilder{prefix: uniquePrefix(x, relAttnPrefix+"_mha")}
	var outs []string
	for _, n := range g.GetNode() {
		s, ok := x.matchMHA(n)
		if !ok {
			continue
		}
		rel := s.rel[0]
		for _, r := range s.rel[1:] {
			rel = b.node("Add", []string{rel, r}, nil)
		}
		ab := b.node("Add", []string{b.node("Reshape", []string{rel, s.shape4}, nil), s.bias}, nil)
		q, scale := s.q, float32(1)
		if s.scale != "" {
			if v, ok := x.constFloat(s.scale); ok && v != 0 {
				scale = 1 / v
			} else {
				q = b.node("Div", []string{q, s.scale}, nil)
			}
		}
		b.nodes = append(b.nodes, &onnxpb.NodeProto{OpType: proto.String("MultiHeadAttention"), Domain: proto.String(msDomain),
			Name: proto.String(b.name("MultiHeadAttention")), Input: []string{q, s.k, s.v, "", "", ab}, Output: []string{s.out},
			Attribute: []*onnxpb.AttributeProto{intAttr("num_heads", int64(heads)),
				{Name: proto.String("scale"), Type: onnxpb.AttributeProto_FLOAT.Enum(), F: proto.Float32(scale)}}})
		outs = append(outs, s.out)
		st.Fused++
	}
	if st.Fused == 0 {
		return st, errNoAttentionCore
	}
	// The old producers of the contexts go; what only they read is dead.
	g.Node = slices.DeleteFunc(g.Node, func(n *onnxpb.NodeProto) bool {
		return len(n.GetOutput()) == 1 && slices.Contains(outs, n.GetOutput()[0])
	})
	g.Node = append(g.Node, b.nodes...)
	ensureOpset(m, msDomain, 1)
	pruneDead(g)
	return st, sortTopologically(g)
}
