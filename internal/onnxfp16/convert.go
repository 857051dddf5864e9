// Package onnxfp16 rewrites a float32 ONNX graph to compute in float16, as
// a GPU deployment runs a transformer: the weights, constants and every
// floating-point activation become float16. It is what tools/onnx-fp16 runs
// (on a GPU host, to make the fp16 twin of a production-size export for
// `make gpu-proof`) and what model's tests use to build fp16 fixtures from
// the float32 test models.
//
// Two forms, the two ways fp16 graphs are shipped:
//   - KeepIOTypes false: float graph inputs and outputs become float16 too,
//     as `optimum-cli export onnx --dtype fp16` writes them (int64 token
//     inputs, float16 logits);
//   - KeepIOTypes true: float inputs and outputs stay float32 with Casts at
//     the boundary around the float16 body (onnxconverter-common's
//     keep_io_types).
//
// Index arithmetic stays float32. Exporters compute some integer results
// through floats (DeBERTa's log-bucketed relative positions: Cast to float,
// Log, Div, Ceil, Cast back to int64); in float16 those round to different
// integers and change the model, while Optimum's fp16 export keeps them in
// float32 because torch computes them outside the half-precision weights.
// So a float tensor whose every use ends in a Cast to a non-float type
// keeps its float32 type here as well.
package onnxfp16

import (
	"errors"
	"fmt"
	"os"
	"slices"

	"google.golang.org/protobuf/proto"

	"github.com/scorer/scorer/model/onnxgraph"
	"github.com/scorer/scorer/model/onnxpb"
)

// Options says which fp16 form to write.
type Options struct {
	// KeepIOTypes keeps float32 graph inputs and outputs around the float16
	// body; false (default) makes them float16, as Optimum's fp16 export.
	KeepIOTypes bool
}

// Stats counts what Convert changed.
type Stats struct {
	// Initializers and Constants are the float tensors converted to
	// float16; Casts the Cast nodes retargeted from float32 to float16.
	Initializers, Constants, Casts int
	// KeptFloat32 is the nodes left computing in float32 (index arithmetic).
	KeptFloat32 int
	// BoundaryCasts is the Cast nodes inserted (graph I/O with KeepIOTypes,
	// and float16 values entering the float32 index arithmetic).
	BoundaryCasts int
}

const (
	f32 = int32(onnxpb.TensorProto_FLOAT)
	f16 = int32(onnxpb.TensorProto_FLOAT16)
)

// ConvertFile reads the float32 graph at in, converts it and writes it to
// out. Graphs with external data (over 2 GB) are not supported.
func ConvertFile(in, out string, o Options) (Stats, error) {
	data, err := os.ReadFile(in)
	if err != nil {
		return Stats{}, fmt.Errorf("onnxfp16: %w", err)
	}
	var m onnxpb.ModelProto
	if err := proto.Unmarshal(data, &m); err != nil {
		return Stats{}, fmt.Errorf("onnxfp16: parsing %s: %w", in, err)
	}
	data = nil
	st, err := Convert(&m, o)
	if err != nil {
		return st, fmt.Errorf("onnxfp16: %s: %w", in, err)
	}
	b, err := proto.Marshal(&m)
	if err != nil {
		return st, fmt.Errorf("onnxfp16: encoding %s: %w", out, err)
	}
	if err := os.WriteFile(out, b, 0o644); err != nil {
		return st, fmt.Errorf("onnxfp16: %w", err)
	}
	return st, nil
}

// Convert rewrites m in place. It refuses graphs it cannot convert
// faithfully: Loop or Scan, an If that computes floats or reads a float
// tensor from the enclosing graph, external data, or an input it cannot
// type.
func Convert(m *onnxpb.ModelProto, o Options) (Stats, error) {
	g := m.GetGraph()
	if g == nil {
		return Stats{}, errors.New("model has no graph")
	}
	c := &converter{g: g, types: map[string]int32{}, consumers: map[string][]int{}, outer: map[int][]string{}}
	if err := c.index(); err != nil {
		return Stats{}, err
	}
	c.inferTypes()
	if err := c.checkSubgraphs(); err != nil {
		return Stats{}, err
	}
	c.markIndexArithmetic()
	if err := c.rewrite(o); err != nil {
		return c.st, err
	}
	// Shapes stay right but element types in value_info would now lie;
	// ORT infers them again.
	g.ValueInfo = nil
	return c.st, nil
}

type converter struct {
	g         *onnxpb.GraphProto
	types     map[string]int32 // element type of every tensor we could type
	consumers map[string][]int // node indexes reading a tensor
	outputs   map[string]bool  // graph outputs
	inits     map[string]*onnxpb.TensorProto
	keep      []bool // per node: stays float32 (index arithmetic)
	// outer holds, per If node, the tensors of this graph its branches
	// read by name (ONNX subgraphs see the enclosing scope), as
	// onnxgraph.OuterReads lists them: a branch output that names such a
	// tensor is a read too.
	outer map[int][]string
	st    Stats
}

func (c *converter) index() error {
	c.outputs = map[string]bool{}
	for _, o := range c.g.GetOutput() {
		c.outputs[o.GetName()] = true
	}
	c.inits = map[string]*onnxpb.TensorProto{}
	for _, t := range c.g.GetInitializer() {
		if t.GetDataLocation() == onnxpb.TensorProto_EXTERNAL {
			return fmt.Errorf("initializer %s keeps its data in an external file; convert a graph saved in one file", t.GetName())
		}
		c.inits[t.GetName()] = t
		c.types[t.GetName()] = t.GetDataType()
	}
	for _, in := range c.g.GetInput() {
		if tt := in.GetType().GetTensorType(); tt != nil {
			c.types[in.GetName()] = tt.GetElemType()
		}
	}
	for i, n := range c.g.GetNode() {
		var reads []string
		for _, a := range n.GetAttribute() {
			if a.GetType() != onnxpb.AttributeProto_GRAPH && a.GetType() != onnxpb.AttributeProto_GRAPHS {
				continue
			}
			if n.GetOpType() != "If" {
				return fmt.Errorf("node %s (%s) has a subgraph; graphs with Loop/Scan are not supported", n.GetName(), n.GetOpType())
			}
			reads = append(reads, onnxgraph.OuterReads(a.GetG())...)
		}
		if reads != nil {
			c.outer[i] = reads
		}
		for _, in := range append(slices.Clone(n.GetInput()), reads...) {
			if in != "" {
				c.consumers[in] = append(c.consumers[in], i)
			}
		}
	}
	return nil
}

func (c *converter) rewrite(o Options) error {
	nodes := c.g.GetNode()
	// Float initializers: convert those the float16 body reads; keep those
	// only index arithmetic reads; give a shared one a float16 copy.
	var extra []*onnxpb.TensorProto
	fp16Name := map[string]string{}
	for name, t := range c.inits {
		if t.GetDataType() != f32 {
			continue
		}
		body, index := false, false
		for _, k := range c.consumers[name] {
			if c.keep[k] {
				index = true
			} else {
				body = true
			}
		}
		switch {
		case !body:
			continue
		case !index:
			if err := toFloat16(t); err != nil {
				return err
			}
			fp16Name[name] = name
		default:
			cp := proto.Clone(t).(*onnxpb.TensorProto)
			cp.Name = proto.String(name + "_fp16")
			if err := toFloat16(cp); err != nil {
				return err
			}
			extra = append(extra, cp)
			fp16Name[name] = cp.GetName()
		}
		c.st.Initializers++
	}
	c.g.Initializer = append(c.g.Initializer, extra...)

	// The float16 type of every float tensor the body computes.
	half := map[string]bool{}
	for _, to := range fp16Name {
		half[to] = true
	}
	for i, n := range nodes {
		if c.keep[i] {
			c.st.KeptFloat32++
			continue
		}
		for k, in := range n.GetInput() {
			if to, ok := fp16Name[in]; ok {
				n.Input[k] = to
			}
		}
		switch n.GetOpType() {
		case "Cast":
			if a := attr(n, "to"); a.GetI() == int64(f32) {
				a.I = proto.Int64(int64(f16))
				c.st.Casts++
			}
		case "Constant", "ConstantOfShape":
			if err := c.constantToFloat16(n); err != nil {
				return err
			}
		}
		for _, out := range n.GetOutput() {
			if isFloat(c.types[out]) {
				half[out] = true
			}
		}
	}
	for _, in := range c.g.GetInput() {
		if tt := in.GetType().GetTensorType(); tt != nil && tt.GetElemType() == f32 {
			if o.KeepIOTypes {
				c.castInput(in.GetName())
			} else {
				tt.ElemType = proto.Int32(f16)
			}
			half[in.GetName()] = true
		}
	}
	// float16 values entering the float32 index arithmetic are cast up
	// (Casts to integers take float16 as they are).
	up := map[string]string{}
	var inserted []*onnxpb.NodeProto
	for i, n := range nodes {
		if !c.keep[i] || n.GetOpType() == "Cast" {
			continue
		}
		for k, in := range n.GetInput() {
			if !half[in] {
				continue
			}
			name, ok := up[in]
			if !ok {
				name = in + "_fp32"
				up[in] = name
				inserted = append(inserted, castNode(in, name, f32))
			}
			n.Input[k] = name
		}
	}
	for _, out := range c.g.GetOutput() {
		tt := out.GetType().GetTensorType()
		if tt == nil || !half[out.GetName()] {
			continue
		}
		if o.KeepIOTypes {
			c.castOutput(out.GetName())
		} else {
			tt.ElemType = proto.Int32(f16)
		}
	}
	c.st.BoundaryCasts += len(inserted)
	c.g.Node = insertBeforeUse(c.g.GetNode(), inserted)
	return nil
}

// castInput makes graph input name float16 inside the graph: its readers
// take a Cast of it.
func (c *converter) castInput(name string) {
	inner := name + "_fp16"
	for _, n := range c.g.GetNode() {
		for k, in := range n.GetInput() {
			if in == name {
				n.Input[k] = inner
			}
		}
	}
	c.g.Node = append([]*onnxpb.NodeProto{castNode(name, inner, f16)}, c.g.GetNode()...)
	c.st.BoundaryCasts++
}

// castOutput keeps graph output name float32: its producer writes a
// float16 tensor that a final Cast turns into name.
func (c *converter) castOutput(name string) {
	inner := name + "_fp16"
	for _, n := range c.g.GetNode() {
		for k, out := range n.GetOutput() {
			if out == name {
				n.Output[k] = inner
			}
		}
		for k, in := range n.GetInput() {
			if in == name {
				n.Input[k] = inner
			}
		}
	}
	c.g.Node = append(c.g.Node, castNode(inner, name, f32))
	c.st.BoundaryCasts++
}

// insertBeforeUse puts each new Cast right after its input's producer
// (inputs and initializers: first), keeping the graph topologically sorted.
func insertBeforeUse(nodes, casts []*onnxpb.NodeProto) []*onnxpb.NodeProto {
	if len(casts) == 0 {
		return nodes
	}
	after := map[string][]*onnxpb.NodeProto{}
	var first []*onnxpb.NodeProto
	produced := map[string]bool{}
	for _, n := range nodes {
		for _, o := range n.GetOutput() {
			produced[o] = true
		}
	}
	for _, cn := range casts {
		if in := cn.GetInput()[0]; produced[in] {
			after[in] = append(after[in], cn)
		} else {
			first = append(first, cn)
		}
	}
	out := append(make([]*onnxpb.NodeProto, 0, len(nodes)+len(casts)), first...)
	for _, n := range nodes {
		out = append(out, n)
		for _, o := range n.GetOutput() {
			out = append(out, after[o]...)
		}
	}
	return out
}

func castNode(in, out string, to int32) *onnxpb.NodeProto {
	return &onnxpb.NodeProto{
		Input: []string{in}, Output: []string{out}, Name: proto.String("fp16_cast_" + out), OpType: proto.String("Cast"),
		Attribute: []*onnxpb.AttributeProto{{Name: proto.String("to"), Type: onnxpb.AttributeProto_INT.Enum(), I: proto.Int64(int64(to))}},
	}
}

func attr(n *onnxpb.NodeProto, name string) *onnxpb.AttributeProto {
	i := slices.IndexFunc(n.GetAttribute(), func(a *onnxpb.AttributeProto) bool { return a.GetName() == name })
	if i < 0 {
		return nil
	}
	return n.GetAttribute()[i]
}

func input(n *onnxpb.NodeProto, i int) string {
	if i < len(n.GetInput()) {
		return n.GetInput()[i]
	}
	return ""
}
