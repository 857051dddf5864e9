package onnxgraph_test

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	ort "github.com/yalue/onnxruntime_go"
	"google.golang.org/protobuf/proto"

	"github.com/scorer/scorer/model/onnxgraph"
	"github.com/scorer/scorer/model/onnxpb"
)

// TestWindowAlignment runs the window arithmetic alone, on relative-position
// indices of every length the planner makes and a table of 512 positions:
// each window is a multiple of 8 wide, holds every index, and stays inside
// the table; with fewer positions than the padded width it is the table.
func TestWindowAlignment(t *testing.T) {
	nodes, inits, starts, ends := onnxgraph.WindowBounds("idx", "a", "x", onnxgraph.AlignPositions)
	g := &onnxpb.GraphProto{Name: proto.String("window"), Node: nodes, Initializer: inits}
	for _, in := range []struct {
		name string
		typ  onnxpb.TensorProto_DataType
	}{{"idx", onnxpb.TensorProto_INT64}, {"a", onnxpb.TensorProto_FLOAT}, {"x", onnxpb.TensorProto_FLOAT}} {
		g.Input = append(g.Input, valueInfo(in.name, in.typ))
	}
	g.Output = []*onnxpb.ValueInfoProto{valueInfo(starts, onnxpb.TensorProto_INT64), valueInfo(ends, onnxpb.TensorProto_INT64)}
	m := &onnxpb.ModelProto{IrVersion: proto.Int64(8), Graph: g,
		OpsetImport: []*onnxpb.OperatorSetIdProto{{Domain: proto.String(""), Version: proto.Int64(14)}}}
	data, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "window.onnx")
	if err := os.WriteFile(file, data, 0o644); err != nil {
		t.Fatal(err)
	}
	sess, err := ort.NewDynamicAdvancedSession(file, []string{"idx", "a", "x"}, []string{starts, ends}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Destroy()
	run := func(lo, hi, positions int64) (int64, int64) {
		t.Helper()
		// Any index tensor with that range: its first and last cells.
		idx := make([]int64, 4)
		idx[0], idx[1], idx[2], idx[3] = lo, hi, lo, hi
		it, _ := ort.NewTensor(ort.NewShape(1, 2, 2), idx)
		at, _ := ort.NewTensor(ort.NewShape(2, 2, 1), make([]float32, 4))
		xt, _ := ort.NewTensor(ort.NewShape(1, positions, 1), make([]float32, positions))
		out := []ort.Value{nil, nil}
		if err := sess.Run([]ort.Value{it, at, xt}, out); err != nil {
			t.Fatal(err)
		}
		s, e := out[0].(*ort.Tensor[int64]).GetData()[0], out[1].(*ort.Tensor[int64]).GetData()[0]
		for _, v := range append(out, it, at, xt) {
			v.Destroy()
		}
		return s, e
	}
	for _, c := range []struct{ lo, hi, positions int64 }{
		{256 - 47, 256 + 47, 512}, // 48 tokens: 95 positions
		{256 - 4, 256 + 4, 512},   // 5 tokens
		{0, 510, 512},             // log buckets at 512 tokens: 511 positions
		{1, 511, 512},             // the window must move left
		{500, 505, 512},           // near the end
		{0, 8, 12},                // fewer positions than the padded width
	} {
		s, e := run(c.lo, c.hi, c.positions)
		w := e - s
		ok := s >= 0 && s <= c.lo && e > c.hi && e <= c.positions &&
			(w%onnxgraph.AlignPositions == 0 || w == c.positions && c.positions < (c.hi-c.lo+onnxgraph.AlignPositions)/onnxgraph.AlignPositions*onnxgraph.AlignPositions)
		if !ok {
			t.Errorf("indices %d..%d of %d positions: window [%d, %d) (%d wide)", c.lo, c.hi, c.positions, s, e, w)
		}
		if pad := w - (c.hi - c.lo + 1); pad >= onnxgraph.AlignPositions || pad < 0 {
			t.Errorf("indices %d..%d: window %d wide for %d positions: %s", c.lo, c.hi, w, c.hi-c.lo+1, fmt.Sprint("padded by ", pad))
		}
	}
}

func valueInfo(name string, typ onnxpb.TensorProto_DataType) *onnxpb.ValueInfoProto {
	return &onnxpb.ValueInfoProto{Name: proto.String(name), Type: &onnxpb.TypeProto{Value: &onnxpb.TypeProto_TensorType{
		TensorType: &onnxpb.TypeProto_Tensor{ElemType: proto.Int32(int32(typ))}}}}
}
