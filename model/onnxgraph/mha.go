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
// The mask goes to MultiHeadAttention as key lengths, not in the bias,
// wherever the bias is the mask step's key mask (keyValid, below):
//
//	context = MultiHeadAttention(Q, K, V, key_padding_mask = lengths, attention_bias = c2p + p2c, …)
//
// with lengths ONNX Runtime's 3B+2 form, [key lengths (B), query starts
// (B+1), key starts (B+1)], built once per run from the key-valid vector
// the mask step already reduces. CUDA's memory-efficient (cutlass) kernel
// takes a key mask in that form only (multihead_attention.cc,
// ComputeInternal, on ORT's main branch: any other mask sends it to the
// unfused path), and it skips the padded keys instead of adding −10⁴ to
// them. The CPU kernel reads the first B entries as each row's end (its
// PrepareMask treats every 1-D mask but 2B as key lengths), so one form
// serves both providers. Key lengths say that a row's real keys are a
// prefix of it: batches must be right-padded, as model/session.go builds
// every attention_mask; the graph cannot tell, so the rewrite is for the
// scorer's own sessions (a left-padded caller would need the additive
// form). Where the bias is anything else, it stays the additive term.
//
// It is off by default: on an H200 it won in the shape bench at 48, 128
// and 512 tokens but halved the real transcripts, whose batches have odd
// lengths, where ONNX Runtime's fused attention with a bias falls back to
// its unfused path (docs/gpu.md); the bias (c2p + p2c) stays, so the
// cutlass kernel still needs the length a multiple of 8 in fp16. The
// fidelity tests hold it to the same 1e-5 as the other steps.

var (
	errNoAttentionCore = errors.New("no attention core found")
	errNoHeads         = errors.New("MultiHeadAttention needs num_attention_heads in config.json")
)

// MHAStats counts what rewriteMHA changed: KeyLengths of the Fused cores
// take the mask as key lengths, the rest in their bias.
type MHAStats struct{ Fused, KeyLengths, Heads int }

func (s MHAStats) String() string {
	return fmt.Sprintf("%d attention cores as MultiHeadAttention (%d heads, %d masked by key lengths)", s.Fused, s.Heads, s.KeyLengths)
}

// keyValid is the [batch, 1, 1, L] float tensor, 1 for a real key, that
// the mask step's bias (keyMaskBias: (keyValid − 1)·10⁴, maybe Cast) is
// made from, or "" when bias is not that.
func (x *Index) keyValid(bias string) string {
	if c := x.Op(bias, "Cast"); c != nil {
		bias = c.GetInput()[0]
	}
	mul := x.Op(bias, "Mul")
	if mul == nil {
		return ""
	}
	if v, ok := x.constFloat(mul.GetInput()[1]); !ok || v != maskBias {
		return ""
	}
	sub := x.Op(mul.GetInput()[0], "Sub")
	if sub == nil {
		return ""
	}
	if v, ok := x.constFloat(sub.GetInput()[1]); !ok || v != 1 {
		return ""
	}
	rm := x.Op(sub.GetInput()[0], "ReduceMax")
	if rm == nil {
		return ""
	}
	return rm.GetOutput()[0]
}

// keyLengths builds ONNX Runtime's 3B+2 mask_index (int32) from keyValid:
// each row's count of real keys, then the query starts and the key starts
// of the padded [batch, L] layout, 0, L, …, B·L, both (queries and keys
// are the same L tokens).
func (b *graphBuilder) keyLengths(keyValid string) string {
	valid := b.node("Reshape", []string{keyValid, b.ints([]int64{2}, 0, -1)}, nil)
	lens := b.node("Cast", []string{b.node("ReduceSum", []string{valid, b.ints([]int64{1}, 1)}, []*onnxpb.AttributeProto{intAttr("keepdims", 0)})},
		[]*onnxpb.AttributeProto{intAttr("to", int64(onnxpb.TensorProto_INT64))})
	l := b.node("Slice", []string{b.node("Shape", []string{valid}, nil), b.ints([]int64{1}, 1), b.ints([]int64{1}, 2)}, nil)
	widths := b.node("Expand", []string{l, b.node("Shape", []string{lens}, nil)}, nil)
	starts := b.node("CumSum", []string{b.node("Concat", []string{b.ints([]int64{1}, 0), widths}, []*onnxpb.AttributeProto{intAttr("axis", 0)}), b.ints(nil, 0)}, nil)
	all := b.node("Concat", []string{lens, starts, starts}, []*onnxpb.AttributeProto{intAttr("axis", 0)})
	return b.node("Cast", []string{all}, []*onnxpb.AttributeProto{intAttr("to", int64(onnxpb.TensorProto_INT32))})
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
	lengths := map[string]string{} // by key-valid tensor
	for _, n := range g.GetNode() {
		s, ok := x.matchMHA(n)
		if !ok {
			continue
		}
		rel := s.rel[0]
		for _, r := range s.rel[1:] {
			rel = b.node("Add", []string{rel, r}, nil)
		}
		ab, mask := b.node("Reshape", []string{rel, s.shape4}, nil), ""
		if kv := x.keyValid(s.bias); kv != "" {
			if mask = lengths[kv]; mask == "" {
				mask = b.keyLengths(kv)
				lengths[kv] = mask
			}
			st.KeyLengths++
		} else {
			ab = b.node("Add", []string{ab, s.bias}, nil)
		}
		q, scale := s.q, float32(1)
		if s.scale != "" {
			if v, ok := x.constFloat(s.scale); ok && v != 0 {
				scale = 1 / v
			} else {
				q = b.node("Div", []string{q, s.scale}, nil)
			}
		}
		b.nodes = append(b.nodes, &onnxpb.NodeProto{OpType: proto.String("MultiHeadAttention"), Domain: proto.String(msDomain),
			Name: proto.String(b.name("MultiHeadAttention")), Input: []string{q, s.k, s.v, "", mask, ab}, Output: []string{s.out},
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
	g.Initializer = append(g.Initializer, b.inits...)
	ensureOpset(m, msDomain, 1)
	pruneDead(g)
	return st, sortTopologically(g)
}
