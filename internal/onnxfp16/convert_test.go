package onnxfp16_test

import (
	"os"
	"path/filepath"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/scorer/scorer/internal/onnxfp16"
	"github.com/scorer/scorer/internal/testenv"
	"github.com/scorer/scorer/model/onnxpb"
)

// On the production architecture (DeBERTa-v3, nli-deberta-v3-tiny) the
// weights become float16 while the log-bucket arithmetic of the relative
// positions (Cast to float, Log, …, Cast to int64) stays float32, and the
// logits output becomes float16 (or stays float32 with KeepIOTypes, behind
// a final Cast).
func TestConvertDeBERTa(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(testenv.ModelDir(t, "nli-deberta-v3-tiny"), "model.onnx"))
	if err != nil {
		t.Fatal(err)
	}
	for _, keep := range []bool{false, true} {
		var m onnxpb.ModelProto
		if err := proto.Unmarshal(data, &m); err != nil {
			t.Fatal(err)
		}
		st, err := onnxfp16.Convert(&m, onnxfp16.Options{KeepIOTypes: keep})
		if err != nil {
			t.Fatal(err)
		}
		g := m.GetGraph()
		// Every float32 Cast left is index arithmetic (the body's became
		// float16 Casts); KeepIOTypes adds the one for the logits.
		logs, float32Casts := 0, 0
		for _, n := range g.GetNode() {
			switch {
			case n.GetOpType() == "Log":
				logs++
			case n.GetOpType() == "Cast" && castTo(n) == f32 && n.GetOutput()[0] != "logits":
				float32Casts++
			}
		}
		halfWeights, floatWeights := 0, 0
		for _, init := range g.GetInitializer() {
			switch init.GetDataType() {
			case f16:
				halfWeights++
			case f32:
				floatWeights++
			}
		}
		out := g.GetOutput()[0].GetType().GetTensorType().GetElemType()
		want := f16
		if keep {
			want = f32
		}
		if logs == 0 || float32Casts == 0 || st.KeptFloat32 == 0 || halfWeights < 10 || floatWeights > halfWeights || out != want || st.Initializers != halfWeights {
			t.Errorf("keep=%v: %d Log nodes, %d float32 casts, %+v, %d float16 / %d float32 initializers, logits type %d (want %d)",
				keep, logs, float32Casts, st, halfWeights, floatWeights, out, want)
		}
	}
}

const (
	f32 = int32(onnxpb.TensorProto_FLOAT)
	f16 = int32(onnxpb.TensorProto_FLOAT16)
)

func castTo(n *onnxpb.NodeProto) int32 {
	for _, a := range n.GetAttribute() {
		if a.GetName() == "to" {
			return int32(a.GetI())
		}
	}
	return 0
}

// A graph it cannot convert faithfully is refused, not half converted.
func TestConvertRefusesExternalData(t *testing.T) {
	m := &onnxpb.ModelProto{Graph: &onnxpb.GraphProto{Initializer: []*onnxpb.TensorProto{{
		Name: proto.String("w"), DataType: proto.Int32(f32), DataLocation: onnxpb.TensorProto_EXTERNAL.Enum()}}}}
	if _, err := onnxfp16.Convert(m, onnxfp16.Options{}); err == nil {
		t.Fatal("converted a graph with external data")
	}
}

// HF's own TorchScript export of DeBERTa-v3 computes its relative positions
// in two If nodes. Their branches are index arithmetic (int64 out, int64
// read from the graph around them): they convert, untouched and float32
// inside, while the body around them becomes float16.
func TestConvertKeepsIndexIfs(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(testenv.ModelDir(t, "nli-deberta-v3-hf-tiny"), "model.onnx"))
	if err != nil {
		t.Fatal(err)
	}
	var m onnxpb.ModelProto
	if err := proto.Unmarshal(data, &m); err != nil {
		t.Fatal(err)
	}
	var before [][]byte
	for _, n := range m.GetGraph().GetNode() {
		if n.GetOpType() == "If" {
			b, err := proto.MarshalOptions{Deterministic: true}.Marshal(n)
			if err != nil {
				t.Fatal(err)
			}
			before = append(before, b)
		}
	}
	if len(before) == 0 {
		t.Fatal("the fixture has no If node: this test checks nothing")
	}
	st, err := onnxfp16.Convert(&m, onnxfp16.Options{})
	if err != nil {
		t.Fatal(err)
	}
	var after [][]byte
	for _, n := range m.GetGraph().GetNode() {
		if n.GetOpType() == "If" {
			b, _ := proto.MarshalOptions{Deterministic: true}.Marshal(n)
			after = append(after, b)
		}
	}
	if len(after) != len(before) {
		t.Fatalf("%d If nodes after conversion, %d before", len(after), len(before))
	}
	for i := range before {
		if string(before[i]) != string(after[i]) {
			t.Errorf("If node %d changed", i)
		}
	}
	if st.Initializers < 10 || st.KeptFloat32 < len(before) {
		t.Errorf("stats %+v: the body was not converted around the Ifs", st)
	}
}

// An If whose branches read a float tensor of the enclosing graph is
// refused: that tensor may become float16 while the branch expects float32.
// So is one whose branch outputs such a tensor unchanged.
func TestConvertRefusesFloatIf(t *testing.T) {
	f32Input := func(name string) *onnxpb.ValueInfoProto {
		return &onnxpb.ValueInfoProto{Name: proto.String(name), Type: &onnxpb.TypeProto{Value: &onnxpb.TypeProto_TensorType{
			TensorType: &onnxpb.TypeProto_Tensor{ElemType: proto.Int32(f32)}}}}
	}
	branch := &onnxpb.GraphProto{
		Node:   []*onnxpb.NodeProto{{OpType: proto.String("Identity"), Input: []string{"x"}, Output: []string{"y"}}},
		Output: []*onnxpb.ValueInfoProto{f32Input("y")},
	}
	graphAttr := func(name string) *onnxpb.AttributeProto {
		return &onnxpb.AttributeProto{Name: proto.String(name), Type: onnxpb.AttributeProto_GRAPH.Enum(), G: branch}
	}
	m := &onnxpb.ModelProto{Graph: &onnxpb.GraphProto{
		Input: []*onnxpb.ValueInfoProto{f32Input("x")},
		Node: []*onnxpb.NodeProto{{OpType: proto.String("If"), Name: proto.String("if"), Input: []string{"cond"}, Output: []string{"out"},
			Attribute: []*onnxpb.AttributeProto{graphAttr("then_branch"), graphAttr("else_branch")}}},
	}}
	if _, err := onnxfp16.Convert(m, onnxfp16.Options{}); err == nil {
		t.Fatal("converted an If that computes floats")
	}

	// A branch may also output the enclosing graph's tensor as it is, with
	// no node reading it: onnxgraph.OuterReads counts that as a read too.
	passThrough := &onnxpb.GraphProto{Output: []*onnxpb.ValueInfoProto{f32Input("x")}}
	m = &onnxpb.ModelProto{Graph: &onnxpb.GraphProto{
		Input: []*onnxpb.ValueInfoProto{f32Input("x")},
		Node: []*onnxpb.NodeProto{{OpType: proto.String("If"), Name: proto.String("if"), Input: []string{"cond"}, Output: []string{"out"},
			Attribute: []*onnxpb.AttributeProto{
				{Name: proto.String("then_branch"), Type: onnxpb.AttributeProto_GRAPH.Enum(), G: passThrough},
				{Name: proto.String("else_branch"), Type: onnxpb.AttributeProto_GRAPH.Enum(), G: passThrough}}}},
	}}
	if _, err := onnxfp16.Convert(m, onnxfp16.Options{}); err == nil {
		t.Fatal("converted an If whose branches pass a float tensor through")
	}
}
