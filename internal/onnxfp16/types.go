package onnxfp16

import (
	"fmt"

	"github.com/scorer/scorer/model/onnxpb"
)

// boolOps produce bool; int64Ops produce int64, whatever their inputs.
var (
	boolOps  = map[string]bool{"Equal": true, "Less": true, "Greater": true, "LessOrEqual": true, "GreaterOrEqual": true, "Not": true, "And": true, "Or": true, "Xor": true, "IsNaN": true, "IsInf": true}
	int64Ops = map[string]bool{"Shape": true, "Size": true, "NonZero": true, "ArgMax": true, "ArgMin": true}
)

// inferTypes types every node output, in graph order (ONNX requires
// topological order): the op's fixed output type where it has one, the
// type an attribute names, else its first typed input's (transformer graphs
// use only ops whose output follows their data input).
func (c *converter) inferTypes() {
	for _, n := range c.g.GetNode() {
		var t int32
		switch op := n.GetOpType(); {
		case op == "Cast":
			t = int32(attr(n, "to").GetI())
		case op == "Constant":
			if v := attr(n, "value"); v != nil && v.GetT() != nil {
				t = v.GetT().GetDataType()
			} else if attr(n, "value_float") != nil || attr(n, "value_floats") != nil {
				t = f32
			} else {
				t = int32(onnxpb.TensorProto_INT64)
			}
		case op == "ConstantOfShape":
			t = f32
			if v := attr(n, "value"); v != nil && v.GetT() != nil {
				t = v.GetT().GetDataType()
			}
		case boolOps[op]:
			t = int32(onnxpb.TensorProto_BOOL)
		case int64Ops[op]:
			t = int32(onnxpb.TensorProto_INT64)
		case op == "Where":
			t = c.types[input(n, 1)]
		case op == "If":
			// Both branches declare the same outputs; they are typed
			// per output below.
			if then := attr(n, "then_branch").GetG(); then != nil {
				for k, out := range n.GetOutput() {
					if k < len(then.GetOutput()) {
						c.types[out] = then.GetOutput()[k].GetType().GetTensorType().GetElemType()
					}
				}
			}
			continue
		default:
			for _, in := range n.GetInput() {
				if tt, ok := c.types[in]; ok && in != "" {
					t = tt
					break
				}
			}
		}
		for _, out := range n.GetOutput() {
			c.types[out] = t
		}
	}
}

// checkSubgraphs admits an If only where leaving its branches untouched is
// faithful: it computes no float output and reads no float tensor of this
// graph (which may become float16 here). HF's TorchScript export of
// DeBERTa-v2/v3 has such Ifs: they compute the int64 relative positions,
// log buckets included, and so stay float32 like any index arithmetic.
func (c *converter) checkSubgraphs() error {
	for i, reads := range c.outer {
		n := c.g.GetNode()[i]
		for _, out := range n.GetOutput() {
			if t, ok := c.types[out]; !ok || t == 0 || isFloat(t) {
				return fmt.Errorf("node %s (If) computes %s, not an integer or bool tensor; only Ifs of index arithmetic are supported", n.GetName(), out)
			}
		}
		for _, in := range reads {
			if isFloat(c.types[in]) {
				return fmt.Errorf("node %s (If) reads float tensor %s of the enclosing graph; only Ifs of index arithmetic are supported", n.GetName(), in)
			}
		}
	}
	return nil
}

// markIndexArithmetic marks the nodes whose every result ends, through any
// number of nodes, in a Cast to a non-float type and nowhere else: integer
// arithmetic done in floats. They keep computing in float32.
func (c *converter) markIndexArithmetic() {
	nodes := c.g.GetNode()
	c.keep = make([]bool, len(nodes))
	for i := len(nodes) - 1; i >= 0; i-- { // consumers come after producers
		n := nodes[i]
		if _, ok := c.outer[i]; ok || n.GetOpType() == "Cast" && !isFloat(int32(attr(n, "to").GetI())) {
			c.keep[i] = true
			continue
		}
		used := false
		all := true
		for _, out := range n.GetOutput() {
			if c.outputs[out] {
				all = false
			}
			for _, k := range c.consumers[out] {
				used = true
				all = all && c.keep[k]
			}
		}
		c.keep[i] = used && all
	}
}

func isFloat(t int32) bool { return t == f32 || t == f16 }
