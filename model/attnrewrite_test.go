package model

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	ort "github.com/yalue/onnxruntime_go"
	"google.golang.org/protobuf/proto"

	"github.com/scorer/scorer/model/onnxpb"
)

// TestAttentionRewriteStructure checks, on each of the three DeBERTa
// families with the default rewrites, what each step promises in the
// graph: no Div reads a c2p/p2c score term (the scale moved onto the
// windows) and no Where reads or feeds a Softmax (one additive key mask
// for all layers, built once).
func TestAttentionRewriteStructure(t *testing.T) {
	for family, path := range relAttnGraphs(t) {
		t.Run(family, func(t *testing.T) {
			rewritten, st := rewrittenFileWith(t, path, mustParseSteps(t, ""))
			// Two layers: 2 c2p/p2c scales each, one softmax each, a
			// residual LayerNorm after attention and after the FFN.
			if st.rel.ScalesMoved != 4 || st.rel.Align != alignPositions || st.mask.Softmaxes != 2 || st.mask.Masks != 1 ||
				st.skipLN.Fused != 4 || st.skipLN.WithBias != 4 {
				t.Errorf("%v; want 4 scales moved, windows aligned to %d, 2 softmaxes sharing 1 mask, 4 LayerNorms fused with their bias", st, alignPositions)
			}
			for name, p := range map[string]string{"exported": path, "rewritten": rewritten} {
				g := readTestGraph(t, p)
				x := indexGraph(g)
				var scoreDivs, maskWheres int
				for _, n := range g.GetNode() {
					switch n.GetOpType() {
					case "Div":
						in := n.GetInput()[0]
						if tr := x.op(in, "Transpose"); tr != nil {
							in = tr.GetInput()[0]
						}
						if x.op(in, "GatherElements") != nil {
							scoreDivs++
						}
					case "Softmax":
						if x.op(n.GetInput()[0], "Where") != nil {
							maskWheres++
						}
						for _, c := range x.consumers[n.GetOutput()[0]] {
							if c.GetOpType() == "Where" {
								maskWheres++
							}
						}
					}
				}
				t.Logf("%s: %d Divs on score terms, %d Wheres around softmaxes", name, scoreDivs, maskWheres)
				if name == "rewritten" && (scoreDivs != 0 || maskWheres != 0) {
					t.Errorf("rewritten: %d Divs on score terms, %d Wheres around softmaxes; want none", scoreDivs, maskWheres)
				}
				if name == "exported" && (scoreDivs != 4 || maskWheres < 2) {
					t.Errorf("exported: %d Divs on score terms, %d Wheres around softmaxes: the fixture no longer has the pattern", scoreDivs, maskWheres)
				}
			}
		})
	}
}

// TestAttentionRewriteSteps runs each step alone and all of them on
// make_deberta.py's --check fixture (lengths 300/150/37/5 padded, and a
// short batch): logits within 1e-5 of the graph as exported, each step on
// its own, so a step that is wrong cannot hide behind another.
func TestAttentionRewriteSteps(t *testing.T) {
	path := filepath.Join("testdata", "deberta-check", "model.onnx")
	fx := readCheckFile(t, filepath.Join("testdata", "deberta-check", "check.json"))
	want := rawLogits(t, path, fx.InputIDs, fx.Lengths)
	rng := rand.New(rand.NewPCG(3, 4))
	short := []int{48, 48, 20, 7}
	shortIDs := randomBatch(rng, short, 1000)
	wantShort := rawLogits(t, path, shortIDs, short)
	mha := RewriteMask + "," + RewriteMHA
	for _, steps := range []string{"none", RewriteAlign, RewriteScale, RewriteMask, RewriteSkipLayerNorm, DefaultAttentionRewrites,
		mha, DefaultAttentionRewrites + "," + RewriteMHA} {
		t.Run(steps, func(t *testing.T) {
			parsed := mustParseSteps(t, steps)
			parsed.heads = 2 // the fixture's num_attention_heads (README.md)
			rewritten, st := rewrittenFileWith(t, path, parsed)
			if parsed.mha && st.mha.Fused != 2 {
				t.Errorf("%s: want both layers' attention as MultiHeadAttention", st)
			}
			d := max(maxDiff(want, rawLogits(t, rewritten, fx.InputIDs, fx.Lengths)),
				maxDiff(wantShort, rawLogits(t, rewritten, shortIDs, short)))
			if d > 1e-5 {
				t.Errorf("%s: max |Δlogit| %.3g > 1e-5", st, d)
			}
			t.Logf("%s: max |Δlogit| %.3g", st, d)
		})
	}
}

// TestWindowAlignment runs the window arithmetic alone, on relative-position
// indices of every length the planner makes and a table of 512 positions:
// each window is a multiple of 8 wide, holds every index, and stays inside
// the table; with fewer positions than the padded width it is the table.
func TestWindowAlignment(t *testing.T) {
	b := &graphBuilder{prefix: "t/"}
	ix := b.windowIndex("idx", "a", "x", alignPositions)
	g := &onnxpb.GraphProto{Name: proto.String("window"), Node: b.nodes, Initializer: b.inits}
	for _, in := range []struct {
		name string
		typ  onnxpb.TensorProto_DataType
	}{{"idx", onnxpb.TensorProto_INT64}, {"a", onnxpb.TensorProto_FLOAT}, {"x", onnxpb.TensorProto_FLOAT}} {
		g.Input = append(g.Input, valueInfo(in.name, in.typ))
	}
	g.Output = []*onnxpb.ValueInfoProto{valueInfo(ix.starts, onnxpb.TensorProto_INT64), valueInfo(ix.ends, onnxpb.TensorProto_INT64)}
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
	sess, err := ort.NewDynamicAdvancedSession(file, []string{"idx", "a", "x"}, []string{ix.starts, ix.ends}, nil)
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
			(w%alignPositions == 0 || w == c.positions && c.positions < (c.hi-c.lo+alignPositions)/alignPositions*alignPositions)
		if !ok {
			t.Errorf("indices %d..%d of %d positions: window [%d, %d) (%d wide)", c.lo, c.hi, c.positions, s, e, w)
		}
		if pad := w - (c.hi - c.lo + 1); pad >= alignPositions || pad < 0 {
			t.Errorf("indices %d..%d: window %d wide for %d positions: %s", c.lo, c.hi, w, c.hi-c.lo+1, fmt.Sprint("padded by ", pad))
		}
	}
}

func valueInfo(name string, typ onnxpb.TensorProto_DataType) *onnxpb.ValueInfoProto {
	return &onnxpb.ValueInfoProto{Name: proto.String(name), Type: &onnxpb.TypeProto{Value: &onnxpb.TypeProto_TensorType{
		TensorType: &onnxpb.TypeProto_Tensor{ElemType: proto.Int32(int32(typ))}}}}
}

// TestAttentionMHAFamilies runs every rewrite with mha on the three DeBERTa
// families (each 2 layers of 2 heads, as their config.json or SOURCE.txt
// says): both layers' attention as one MultiHeadAttention, logits within
// 1e-5 of the graph as exported on padded batches past 129 tokens and
// short ones.
func TestAttentionMHAFamilies(t *testing.T) {
	for family, path := range relAttnGraphs(t) {
		t.Run(family, func(t *testing.T) {
			steps := mustParseSteps(t, DefaultAttentionRewrites+","+RewriteMHA)
			steps.heads = 2
			rewritten, st := rewrittenFileWith(t, path, steps)
			if st.mha.Fused != 2 {
				t.Fatalf("%s: want 2 attention cores as MultiHeadAttention", st)
			}
			rng := rand.New(rand.NewPCG(5, 6))
			var worst float64
			for _, lens := range [][]int{{300, 150, 37, 5}, {48, 48, 20}, {9}} {
				ids := randomBatch(rng, lens, 1000)
				d := maxDiff(rawLogits(t, path, ids, lens), rawLogits(t, rewritten, ids, lens))
				worst = max(worst, d)
				if d > 1e-5 {
					t.Errorf("lengths %v: max |Δlogit| %.3g > 1e-5", lens, d)
				}
			}
			t.Logf("%s: %s: max |Δlogit| %.3g", family, st, worst)
		})
	}
}
