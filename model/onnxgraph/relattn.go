package onnxgraph

import (
	"errors"
	"fmt"
	"math"
	"slices"

	"google.golang.org/protobuf/proto"

	"github.com/scorer/scorer/model/onnxpb"
)

// DeBERTa-v2/v3's disentangled attention, as every exporter writes it
// (modeling_deberta_v2.py traced by torch.onnx, TorchScript or dynamo),
// computes each layer's content-to-position and position-to-content scores
// as
//
//	GatherElements(MatMul(A, Transpose(Tile(P, [rows, 1, 1]))), Expand(I, [rows·heads, L, L]))
//
// where P is [heads, 2·span, d] (the projected relative embeddings), A is
// [rows·heads, L, d] (queries or keys) and I is [L, L] (the clamped
// relative-position bucket of each query/key pair). Every row multiplies
// against all 2·span = 512 positions, while only the buckets in I's range
// are read: for L ≤ 129 the buckets are the identity, so 2L−1 of them.
//
// rewriteRelAttention replaces each such gather by
//
//	GatherElements(Reshape(MatMul(Reshape(A, [rows, heads, L, d]), Transpose(Slice(P, lo, hi+1, axis 1))), [-1, L, W]), E, axis 2)
//
// with lo, hi = min, max of I, W = hi−lo+1 and E = I − lo as int32,
// expanded to [rows·heads, L, L]: the window of positions the sequence can
// use, multiplied head-major without the Tile, and one index built once
// per run in place of one int64 Expand per layer. The window and E are
// built once per distinct I (graphs share I between layers, or compute it
// identically in each: structurally equal index graphs share one E).
// Because the window is I's own range, log buckets past 129 tokens keep
// working: it is then the bucketed range.
//
// Why GatherElements and not a Gather from the flattened scores with a
// [L, L] index: ORT's CPU Gather copies one element per index there, which
// on the production-size stand-in at 512 tokens took 2.5× the time of the
// original Expands and GatherElements together (tools/ortprofile).

// RelAttnStats counts what rewriteRelAttention changed.
type RelAttnStats struct {
	// Gathers is the GatherElements replaced; Indices the flat indices
	// built for them (one per structurally distinct I).
	Gathers, Indices int
	// TilesLeft is the Tiles still computed after the rewrite because
	// something other than a rewritten product or a Shape reads them.
	TilesLeft int
	// Align is the multiple the windows were widened to (0: exact).
	Align int64
	// ScalesMoved is the score terms whose Div moved onto their window.
	ScalesMoved int
}

func (s RelAttnStats) String() string {
	msg := fmt.Sprintf("%d relative-position gathers windowed, sharing %d indices", s.Gathers, s.Indices)
	if s.Align > 0 {
		msg += fmt.Sprintf(", windows aligned to %d", s.Align)
	}
	if s.ScalesMoved > 0 {
		msg += fmt.Sprintf(", %d score scales moved onto the windows", s.ScalesMoved)
	}
	if s.TilesLeft > 0 {
		msg += fmt.Sprintf(" (%d Tiles still read elsewhere and kept)", s.TilesLeft)
	}
	return msg
}

// ErrNoRelAttention is rewriteRelAttention's answer for a graph without
// the pattern: it runs unchanged.
var ErrNoRelAttention = errors.New("no disentangled-attention gather found")

// relAttnPrefix starts the names of the nodes and constants the rewrite
// adds (with a number when the graph already uses it).
const relAttnPrefix = "scorer_relattn"

// relAttnMinOpset is the first default-domain opset whose Slice, Range,
// Reshape and reductions have the forms the rewrite writes.
const relAttnMinOpset = 13

// relAttnSite is one matched gather: out = GatherElements(A·Transpose(Tile(X, reps)), Expand(I, _)).
// scale, when set, is the Div by a scalar that the score term goes through
// next (directly for c2p, after a Transpose for p2c), and transposeOut
// that Transpose, if any.
type relAttnSite struct {
	gather, matmul, transpose, tile, expand *onnxpb.NodeProto
	a, x, index                             string
	scale, transposeOut                     *onnxpb.NodeProto
}

// relAttnOptions are the rewrite's optional parts (attention.go names
// them for the settings).
type relAttnOptions struct {
	// align, when above 1, widens each window of relative positions to a
	// multiple of align: fp16 tensor-core products want every dimension a
	// multiple of 8, and the exact window (2L−1 positions) is always odd,
	// which on an H200 fell to a 1-element-aligned sm75 kernel taking 17%
	// of the GPU's time (gpu-evidence/2026-11-27/ncu). The extra positions
	// are real ones whose scores no index reads.
	align int64
	// scale moves each score term's Div by the attention scale onto its
	// window: GatherElements(A·Wᵀ)/s = GatherElements(A·(W/s)ᵀ), so the
	// [rows·heads, L, L] Div of every c2p and p2c term becomes one on a
	// [heads, W, d] window.
	scale bool
}

// matchRelAttn matches the pattern at a GatherElements node.
func (x *Index) matchRelAttn(ge *onnxpb.NodeProto) (relAttnSite, bool) {
	s := relAttnSite{gather: ge}
	if ge.GetOpType() != "GatherElements" || ge.GetDomain() != "" || len(ge.GetInput()) != 2 {
		return s, false
	}
	if ax := attrInt(ge, "axis", 0); ax != -1 && ax != 2 {
		return s, false
	}
	data, idx := ge.GetInput()[0], ge.GetInput()[1]
	if s.matmul = x.Op(data, "MatMul"); s.matmul == nil || x.only(data) != ge {
		return s, false
	}
	t := s.matmul.GetInput()[1]
	if s.transpose = x.Op(t, "Transpose"); s.transpose == nil || x.only(t) != s.matmul {
		return s, false
	}
	var perm []int64
	for _, a := range s.transpose.GetAttribute() {
		if a.GetName() == "perm" {
			perm = a.GetInts()
		}
	}
	if !slices.Equal(perm, []int64{0, 2, 1}) {
		return s, false
	}
	if s.tile = x.Op(s.transpose.GetInput()[0], "Tile"); s.tile == nil || !x.repeatsFirstAxis(s.tile.GetInput()[1]) {
		return s, false
	}
	// The Expand may be shared (dynamo's export reuses one for every
	// layer); it goes when its last reader does.
	if s.expand = x.Op(idx, "Expand"); s.expand == nil {
		return s, false
	}
	s.a, s.x, s.index = s.matmul.GetInput()[0], s.tile.GetInput()[0], s.expand.GetInput()[0]
	return s, true
}

// repeatsFirstAxis reports whether a Tile's repeats are [n, 1, 1]: the
// batch copies of a [heads, positions, d] tensor, so that row k·heads+h of
// the tiled tensor is head h. Exporters write them as a constant or as
// Concat(n, 1, 1).
func (x *Index) repeatsFirstAxis(reps string) bool {
	if v, ok := x.constInts(reps); ok {
		return len(v) == 3 && v[1] == 1 && v[2] == 1
	}
	c := x.Op(reps, "Concat")
	if c == nil || len(c.GetInput()) != 3 {
		return false
	}
	for _, in := range c.GetInput()[1:] {
		if v, ok := x.constInts(in); !ok || !slices.Equal(v, []int64{1}) {
			return false
		}
	}
	return true
}

// rewriteRelAttention rewrites g in place (see the comment above); opset is
// the model's default-domain opset. A graph without the pattern comes back
// untouched with ErrNoRelAttention.
func rewriteRelAttention(g *onnxpb.GraphProto, opset int64, opts relAttnOptions) (RelAttnStats, error) {
	var st RelAttnStats
	x := NewIndex(g)
	var sites []relAttnSite
	for _, n := range g.GetNode() {
		if s, ok := x.matchRelAttn(n); ok {
			if opts.scale {
				x.matchScale(&s)
			}
			sites = append(sites, s)
		}
	}
	if len(sites) == 0 {
		return st, ErrNoRelAttention
	}
	if opset < relAttnMinOpset {
		return st, fmt.Errorf("opset %d is older than %d", opset, relAttnMinOpset)
	}
	b := &graphBuilder{prefix: uniquePrefix(x, relAttnPrefix)}
	sigs := newSigner(g)
	indices := map[string]relAttnIndex{}
	replaced := map[*onnxpb.NodeProto]bool{}
	for _, s := range sites {
		sig := sigs.of(s.index)
		ix, ok := indices[sig]
		if !ok {
			ix = b.windowIndex(s.index, s.a, s.x, opts.align)
			indices[sig] = ix
		}
		b.site(s, ix)
		replaced[s.gather] = true
		if s.scale != nil {
			replaced[s.scale] = true
			st.ScalesMoved++
		}
	}
	st.Gathers, st.Indices = len(sites), len(indices)
	if opts.align > 1 {
		st.Align = opts.align
	}

	// Shape(Tile(X, reps)) is Shape(X)·reps; written so, a Tile whose
	// shape is read (HF's scale, sqrt(d·3)) is no longer computed.
	tiles := map[*onnxpb.NodeProto]bool{}
	for _, s := range sites {
		if tiles[s.tile] {
			continue
		}
		tiles[s.tile] = true
		for _, c := range x.consumers[s.tile.GetOutput()[0]] {
			if c.GetOpType() != "Shape" || len(c.GetAttribute()) > 0 || replaced[c] {
				continue
			}
			shp := b.node("Shape", []string{s.x}, nil)
			b.nodes = append(b.nodes, &onnxpb.NodeProto{OpType: proto.String("Mul"), Name: proto.String(b.name("shape_of_tile")),
				Input: []string{shp, s.tile.GetInput()[1]}, Output: slices.Clone(c.GetOutput())})
			replaced[c] = true
		}
	}
	g.Node = slices.DeleteFunc(g.Node, func(n *onnxpb.NodeProto) bool { return replaced[n] })
	g.Node = append(g.Node, b.nodes...)
	g.Initializer = append(g.Initializer, b.inits...)
	pruneDead(g)
	for _, n := range g.GetNode() {
		if tiles[n] {
			st.TilesLeft++
		}
	}
	if err := sortTopologically(g); err != nil {
		return st, err
	}
	return st, nil
}

// relAttnIndex is what one distinct I gives every site that reads it: the
// window's bounds as Slice's starts and ends ([1] each), the gather index
// I − start as int32 expanded to [rows·heads, L, L] once, and the
// [-1, L, W] shape the windowed scores take for it.
type relAttnIndex struct {
	starts, ends, index, scoresShape string
}

// windowIndex builds the window and the shared index from I (int64,
// [..., L, L] with leading ones); x is a site's [heads, positions, d]
// relative embeddings, whose position count every site shares, and a the
// first site's [rows·heads, L, d] input, whose first dimension every site
// shares. With align
// above 1 the window is widened to a multiple of align positions, moved
// left where it would run past the last position (it still holds [lo, hi]),
// and cut to the positions there are when there are fewer.
func (b *graphBuilder) windowIndex(idx, a, x string, align int64) relAttnIndex {
	one, vec := b.ints(nil, 1), b.ints([]int64{1}, 1)
	lo := b.node("ReduceMin", []string{idx}, []*onnxpb.AttributeProto{intAttr("keepdims", 0)})
	hi := b.node("ReduceMax", []string{idx}, []*onnxpb.AttributeProto{intAttr("keepdims", 0)})
	start, width := lo, b.node("Add", []string{b.node("Sub", []string{hi, lo}, nil), one}, nil)
	if align > 1 {
		al := b.ints(nil, align)
		padded := b.node("Mul", []string{b.node("Div", []string{b.node("Add", []string{width, b.ints(nil, align-1)}, nil), al}, nil), al}, nil)
		positions := b.node("Reshape", []string{b.node("Slice", []string{b.node("Shape", []string{x}, nil), vec, b.ints([]int64{1}, 2)}, nil), b.ints([]int64{0})}, nil)
		start = b.node("Max", []string{b.node("Min", []string{lo, b.node("Sub", []string{positions, padded}, nil)}, nil), b.ints(nil, 0)}, nil)
		width = b.node("Min", []string{padded, positions}, nil)
	}
	qk := b.node("Slice", []string{b.node("Shape", []string{idx}, nil), b.ints([]int64{1}, -2), b.ints([]int64{1}, math.MaxInt64)}, nil)
	rel := b.node("Sub", []string{b.node("Reshape", []string{idx, qk}, nil), start}, nil)
	// int32 halves the index's bytes; W < 2³¹ always.
	rel32 := b.node("Cast", []string{rel}, []*onnxpb.AttributeProto{intAttr("to", int64(onnxpb.TensorProto_INT32))})
	bh := b.node("Slice", []string{b.node("Shape", []string{a}, nil), b.ints([]int64{1}, 0), vec}, nil)
	lq := b.node("Slice", []string{qk, b.ints([]int64{1}, 0), vec}, nil)
	return relAttnIndex{
		starts: b.node("Reshape", []string{start, vec}, nil),
		ends:   b.node("Reshape", []string{b.node("Add", []string{start, width}, nil), vec}, nil),
		index:  b.node("Expand", []string{rel32, b.node("Concat", []string{bh, qk}, []*onnxpb.AttributeProto{intAttr("axis", 0)})}, nil),
		scoresShape: b.node("Concat", []string{b.ints([]int64{1}, -1), lq, b.node("Reshape", []string{width, vec}, nil)},
			[]*onnxpb.AttributeProto{intAttr("axis", 0)}),
	}
}

// site replaces one gather; its output keeps the gather's name, so every
// reader is unchanged. When the site's scale moved, the window is divided
// instead and the score term's Div is gone: the gather (c2p) or the
// Transpose after it (p2c) then writes the Div's output.
func (b *graphBuilder) site(s relAttnSite, ix relAttnIndex) {
	win := b.node("Slice", []string{s.x, ix.starts, ix.ends, b.ints([]int64{1}, 1)}, nil)
	out := slices.Clone(s.gather.GetOutput())
	if s.scale != nil {
		win = b.node("Div", []string{win, s.scale.GetInput()[1]}, nil)
		if s.transposeOut != nil {
			s.transposeOut.Output = slices.Clone(s.scale.GetOutput())
		} else {
			out = slices.Clone(s.scale.GetOutput())
		}
	}
	winT := b.node("Transpose", []string{win}, []*onnxpb.AttributeProto{intsAttr("perm", 0, 2, 1)})
	heads := b.node("Slice", []string{b.node("Shape", []string{s.x}, nil), b.ints([]int64{1}, 0), b.ints([]int64{1}, 1)}, nil)
	ld := b.node("Slice", []string{b.node("Shape", []string{s.a}, nil), b.ints([]int64{1}, 1), b.ints([]int64{1}, 3)}, nil)
	shape4 := b.node("Concat", []string{b.ints([]int64{1}, -1), heads, ld}, []*onnxpb.AttributeProto{intAttr("axis", 0)})
	scores := b.node("MatMul", []string{b.node("Reshape", []string{s.a, shape4}, nil), winT}, nil)
	b.nodes = append(b.nodes, &onnxpb.NodeProto{OpType: proto.String("GatherElements"), Name: proto.String(b.name("GatherElements")),
		Input:     []string{b.node("Reshape", []string{scores, ix.scoresShape}, nil), ix.index},
		Output:    out,
		Attribute: []*onnxpb.AttributeProto{intAttr("axis", 2)}})
}

// matchScale finds the Div by a scalar that a site's score term goes
// through next: Div(gather, s) (c2p) or Div(Transpose(gather), s) (p2c),
// each the only reader of what it reads.
func (x *Index) matchScale(s *relAttnSite) {
	out := s.gather.GetOutput()[0]
	next := x.only(out)
	var tr *onnxpb.NodeProto
	if next != nil && next.GetOpType() == "Transpose" && next.GetDomain() == "" {
		tr, next = next, x.only(next.GetOutput()[0])
	}
	if next == nil || next.GetOpType() != "Div" || next.GetDomain() != "" || len(next.GetInput()) != 2 {
		return
	}
	want := out
	if tr != nil {
		want = tr.GetOutput()[0]
	}
	if next.GetInput()[0] != want || !x.scalar(next.GetInput()[1], 0) {
		return
	}
	s.scale, s.transposeOut = next, tr
}
