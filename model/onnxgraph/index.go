package onnxgraph

import (
	"encoding/binary"
	"math"
	"slices"

	"github.com/scorer/scorer/model/onnxpb"
)

// Index is a graph's producers and consumers by tensor name, its
// initializers and its outputs, as they were when NewIndex ran: a rewrite
// that changes the graph indexes it again.
type Index struct {
	g         *onnxpb.GraphProto
	producer  map[string]*onnxpb.NodeProto
	consumers map[string][]*onnxpb.NodeProto
	inits     map[string]*onnxpb.TensorProto
	outputs   map[string]bool
}

// NewIndex indexes g (its top level; subgraphs count as their node's reads).
func NewIndex(g *onnxpb.GraphProto) *Index {
	x := &Index{g: g, producer: map[string]*onnxpb.NodeProto{}, consumers: map[string][]*onnxpb.NodeProto{},
		inits: map[string]*onnxpb.TensorProto{}, outputs: map[string]bool{}}
	for _, t := range g.GetInitializer() {
		x.inits[t.GetName()] = t
	}
	for _, o := range g.GetOutput() {
		x.outputs[o.GetName()] = true
	}
	for _, n := range g.GetNode() {
		for _, o := range n.GetOutput() {
			x.producer[o] = n
		}
		for _, in := range nodeReads(n) {
			x.consumers[in] = append(x.consumers[in], n)
		}
	}
	return x
}

// Consumers is the nodes reading name, in graph order: one entry per
// read, so a node reading it twice is listed twice; an If, Loop or Scan
// reads what its subgraphs read from the enclosing scope (OuterReads).
func (x *Index) Consumers(name string) []*onnxpb.NodeProto { return x.consumers[name] }

// nodeReads is every tensor a node reads: its inputs and, for If, Loop and
// Scan, the outer-scope names its subgraphs refer to.
func nodeReads(n *onnxpb.NodeProto) []string {
	reads := slices.Clone(n.GetInput())
	for _, a := range n.GetAttribute() {
		for _, sg := range append(slices.Clone(a.GetGraphs()), a.GetG()) {
			if sg != nil {
				reads = append(reads, OuterReads(sg)...)
			}
		}
	}
	return reads
}

// OuterReads is the names a subgraph (and the subgraphs in it) reads
// without defining them: tensors of an enclosing scope, in the order its
// nodes read them and then its outputs (a subgraph may output an outer
// tensor as it is), one entry per read. What the subgraph defines is local
// wherever its node stands, so the answer does not depend on node order.
func OuterReads(g *onnxpb.GraphProto) []string {
	local := map[string]bool{}
	for _, t := range g.GetInitializer() {
		local[t.GetName()] = true
	}
	for _, in := range g.GetInput() {
		local[in.GetName()] = true
	}
	for _, n := range g.GetNode() {
		for _, o := range n.GetOutput() {
			local[o] = true
		}
	}
	var outer []string
	for _, n := range g.GetNode() {
		for _, in := range nodeReads(n) {
			if in != "" && !local[in] {
				outer = append(outer, in)
			}
		}
	}
	for _, o := range g.GetOutput() {
		if !local[o.GetName()] {
			outer = append(outer, o.GetName())
		}
	}
	return outer
}

// only is the node reading name when it is the single reader and name is
// not a graph output, else nil.
func (x *Index) only(name string) *onnxpb.NodeProto {
	if cs := x.consumers[name]; len(cs) == 1 && !x.outputs[name] {
		return cs[0]
	}
	return nil
}

// Op is the node producing name if its type is opType (default domain),
// else nil.
func (x *Index) Op(name, opType string) *onnxpb.NodeProto {
	if n := x.producer[name]; n != nil && n.GetOpType() == opType && n.GetDomain() == "" {
		return n
	}
	return nil
}

// constInts is the value of an int64 constant (initializer or Constant
// node), or false.
func (x *Index) constInts(name string) ([]int64, bool) {
	t := x.inits[name]
	if n := x.Op(name, "Constant"); n != nil {
		for _, a := range n.GetAttribute() {
			if a.GetName() == "value" {
				t = a.GetT()
			}
		}
	}
	if t == nil || t.GetDataType() != int32(onnxpb.TensorProto_INT64) {
		return nil, false
	}
	if raw := t.GetRawData(); len(raw) > 0 {
		if len(raw)%8 != 0 {
			return nil, false
		}
		v := make([]int64, len(raw)/8)
		for i := range v {
			v[i] = int64(binary.LittleEndian.Uint64(raw[8*i:]))
		}
		return v, true
	}
	return t.GetInt64Data(), t.GetDataLocation() != onnxpb.TensorProto_EXTERNAL
}

func attrInt(n *onnxpb.NodeProto, name string, def int64) int64 {
	for _, a := range n.GetAttribute() {
		if a.GetName() == name {
			return a.GetI()
		}
	}
	return def
}

// scalar reports whether name is a one-element tensor of rank 0 or 1, as
// far as the graph shows without running it: a constant, one dimension of
// a Shape (by Gather or Slice), or elementwise maths of such values. Only a
// scalar can move from a score term onto its window.
func (x *Index) scalar(name string, depth int) bool {
	if depth > 16 {
		return false
	}
	if t := x.constTensor(name); t != nil {
		n := int64(1)
		for _, d := range t.GetDims() {
			n *= d
		}
		return n == 1 && len(t.GetDims()) <= 1
	}
	n := x.producer[name]
	if n == nil || n.GetDomain() != "" {
		return false
	}
	switch n.GetOpType() {
	case "Cast", "Sqrt", "Neg", "Reciprocal", "Identity", "Squeeze":
		return x.scalar(n.GetInput()[0], depth+1)
	case "Slice":
		// Slice(Shape(t), [k], [k+1]) or ([-1], [big]): one dimension (HF
		// computes the scale from the last dimension so).
		if x.Op(n.GetInput()[0], "Shape") == nil || len(n.GetInput()) < 3 {
			return false
		}
		starts, ok1 := x.constInts(n.GetInput()[1])
		ends, ok2 := x.constInts(n.GetInput()[2])
		return ok1 && ok2 && len(starts) == 1 && len(ends) == 1 &&
			(ends[0]-starts[0] == 1 || starts[0] == -1 && ends[0] >= math.MaxInt32)
	case "Mul", "Div", "Add", "Sub", "Pow":
		return x.scalar(n.GetInput()[0], depth+1) && x.scalar(n.GetInput()[1], depth+1)
	case "Gather":
		// Gather(Shape(t), k) with a scalar k is one dimension: rank 0.
		idx := x.constTensor(n.GetInput()[1])
		return idx != nil && len(idx.GetDims()) == 0 && x.Op(n.GetInput()[0], "Shape") != nil
	}
	return false
}

// constTensor is the value of an initializer or Constant node named name,
// or nil.
func (x *Index) constTensor(name string) *onnxpb.TensorProto {
	if t := x.inits[name]; t != nil {
		return t
	}
	if n := x.Op(name, "Constant"); n != nil {
		for _, a := range n.GetAttribute() {
			if a.GetName() == "value" {
				return a.GetT()
			}
		}
	}
	return nil
}

// operand is n's input produced by an opType node (either input of a
// binary op) and the other input.
func (x *Index) operand(n *onnxpb.NodeProto, opType string) (*onnxpb.NodeProto, string) {
	if len(n.GetInput()) != 2 {
		return nil, ""
	}
	for i, in := range n.GetInput() {
		if p := x.Op(in, opType); p != nil {
			return p, n.GetInput()[1-i]
		}
	}
	return nil, ""
}

// lastAxis reports whether a ReduceMean averages over the last axis only.
func (x *Index) lastAxis(n *onnxpb.NodeProto) bool {
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
func (x *Index) constFloat(name string) (float32, bool) {
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
			return Float16ToFloat32(uint16(v[0])), true
		}
		if raw := t.GetRawData(); len(raw) == 2 {
			return Float16ToFloat32(binary.LittleEndian.Uint16(raw)), true
		}
	}
	return 0, false
}

// vector reports whether name is a one-dimensional initializer, or an
// Identity of one (TorchScript shares weights so).
func (x *Index) vector(name string) bool {
	for range 4 {
		if t := x.inits[name]; t != nil {
			return len(t.GetDims()) == 1
		}
		n := x.Op(name, "Identity")
		if n == nil {
			return false
		}
		name = n.GetInput()[0]
	}
	return false
}

// permOf is a Transpose's perm attribute, or nil.
func permOf(n *onnxpb.NodeProto) []int64 {
	for _, a := range n.GetAttribute() {
		if a.GetName() == "perm" {
			return a.GetInts()
		}
	}
	return nil
}

// data is the one node reading name's values, when every other reader
// reads only its shape (TorchScript computes each Reshape's target from
// Shape nodes), else nil.
func (x *Index) data(name string) *onnxpb.NodeProto {
	var reader *onnxpb.NodeProto
	for _, c := range x.consumers[name] {
		if c.GetOpType() == "Shape" && c.GetDomain() == "" {
			continue
		}
		if reader != nil {
			return nil
		}
		reader = c
	}
	if x.outputs[name] {
		return nil
	}
	return reader
}
