package onnxgraph

import (
	"slices"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/scorer/scorer/model/onnxpb"
)

func testNode(op string, in []string, out ...string) *onnxpb.NodeProto {
	return &onnxpb.NodeProto{OpType: proto.String(op), Name: proto.String(out[0]), Input: in, Output: out}
}

func testValues(names ...string) []*onnxpb.ValueInfoProto {
	var vs []*onnxpb.ValueInfoProto
	for _, n := range names {
		vs = append(vs, &onnxpb.ValueInfoProto{Name: proto.String(n)})
	}
	return vs
}

func withBranch(n *onnxpb.NodeProto, g *onnxpb.GraphProto) *onnxpb.NodeProto {
	n.Attribute = append(n.Attribute, &onnxpb.AttributeProto{Name: proto.String("then_branch"), Type: onnxpb.AttributeProto_GRAPH.Enum(), G: g})
	return n
}

// OuterReads is what a subgraph reads from its enclosing scopes: not its
// inputs, initializers or what any of its nodes computes (wherever that
// node stands), through nested subgraphs, and an output that names an
// outer tensor as it is; one entry per read, empty names skipped.
func TestOuterReads(t *testing.T) {
	inner := &onnxpb.GraphProto{
		Node:   []*onnxpb.NodeProto{testNode("Add", []string{"mid", "outer3"}, "deep")},
		Output: testValues("deep", "outer4"),
	}
	g := &onnxpb.GraphProto{
		Input:       testValues("in"),
		Initializer: []*onnxpb.TensorProto{{Name: proto.String("w")}},
		Node: []*onnxpb.NodeProto{
			testNode("Mul", []string{"late", "outer1"}, "early"), // late is defined below: still local
			testNode("Add", []string{"in", "w"}, "late"),
			testNode("Clip", []string{"early", "", "outer2"}, "mid"),
			withBranch(testNode("If", []string{"outer1"}, "nested"), inner),
		},
		Output: testValues("nested", "outer5", "in"),
	}
	want := []string{"outer1", "outer2", "outer1", "outer3", "outer4", "outer5"}
	if got := OuterReads(g); !slices.Equal(got, want) {
		t.Errorf("OuterReads = %q, want %q", got, want)
	}
	if got := OuterReads(&onnxpb.GraphProto{Node: []*onnxpb.NodeProto{testNode("Identity", []string{"x"}, "y")}, Output: testValues("y")}); !slices.Equal(got, []string{"x"}) {
		t.Errorf("one Identity: %q", got)
	}
}

// The index counts an If as a reader of what its branches read outside
// them; pruneDead keeps what only a branch reads, and sortTopologically
// puts its producer before the If, keeping the order where it holds.
func TestIndexPruneSortSubgraphReads(t *testing.T) {
	branch := &onnxpb.GraphProto{
		Node:   []*onnxpb.NodeProto{testNode("Neg", []string{"a"}, "b")},
		Output: testValues("b", "c"),
	}
	g := &onnxpb.GraphProto{
		Input: testValues("x", "cond"),
		Node: []*onnxpb.NodeProto{
			withBranch(testNode("If", []string{"cond"}, "y"), branch),
			testNode("Relu", []string{"x"}, "a"),
			testNode("Sigmoid", []string{"x"}, "c"),
			testNode("Tanh", []string{"x"}, "dead"),
		},
		Output: testValues("y"),
	}
	x := NewIndex(g)
	for _, name := range []string{"a", "c", "cond"} {
		if cs := x.Consumers(name); len(cs) != 1 || cs[0].GetOpType() != "If" {
			t.Errorf("readers of %s: %v; want the If", name, cs)
		}
	}
	if x.Op("a", "Relu") == nil || x.Op("a", "Tanh") != nil || x.only("a") == nil || x.only("y") != nil {
		t.Error("Op or only is wrong on a plain graph")
	}
	pruneDead(g)
	if err := sortTopologically(g); err != nil {
		t.Fatal(err)
	}
	var order []string
	for _, n := range g.GetNode() {
		order = append(order, n.GetOpType())
	}
	if want := []string{"Relu", "Sigmoid", "If"}; !slices.Equal(order, want) {
		t.Errorf("nodes after pruneDead and sortTopologically: %v, want %v", order, want)
	}
	g.Node = append(g.Node, testNode("Abs", []string{"z"}, "z2"), testNode("Abs", []string{"z2"}, "z"))
	if err := sortTopologically(g); err == nil {
		t.Error("a cycle sorted without error")
	}
}

// uniquePrefix avoids every name the graph uses, and the builder shares
// one constant per value.
func TestUniquePrefixAndBuilder(t *testing.T) {
	g := &onnxpb.GraphProto{
		Initializer: []*onnxpb.TensorProto{{Name: proto.String("p/w")}},
		Node:        []*onnxpb.NodeProto{testNode("Relu", []string{"x"}, "p2/y")},
	}
	if got := uniquePrefix(NewIndex(g), "p"); got != "p3/" {
		t.Errorf("uniquePrefix = %q, want p3/", got)
	}
	b := &graphBuilder{prefix: "q/"}
	c1, c2, c3 := b.ints([]int64{1}, 5), b.ints([]int64{1}, 5), b.ints(nil, 5)
	if c1 != c2 || c1 == c3 || len(b.inits) != 2 {
		t.Errorf("constants %s %s %s, %d initializers; want the [1]-shaped one shared", c1, c2, c3, len(b.inits))
	}
	out := b.node("Add", []string{c1, c3}, []*onnxpb.AttributeProto{intAttr("k", 1)})
	if n := b.nodes[0]; n.GetOutput()[0] != out || attrInt(n, "k", 0) != 1 || attrInt(n, "missing", 7) != 7 {
		t.Errorf("node %v", n)
	}
}
