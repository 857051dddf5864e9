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
