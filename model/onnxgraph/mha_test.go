package onnxgraph_test

import (
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"testing"

	ort "github.com/yalue/onnxruntime_go"
	"google.golang.org/protobuf/proto"

	"github.com/scorer/scorer/internal/testenv"
	"github.com/scorer/scorer/model/onnxgraph"
	"github.com/scorer/scorer/model/onnxpb"
)

func readModel(t *testing.T, path string) *onnxpb.ModelProto {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	m := &onnxpb.ModelProto{}
	if err := proto.Unmarshal(b, m); err != nil {
		t.Fatal(err)
	}
	return m
}

// paddedBatch is rows of random ids, [CLS]=1 first, right-padded with 0
// as model/session.go pads them, and their attention mask.
func paddedBatch(rng *rand.Rand, lens []int) (ids, mask []int64, width int) {
	width = slices.Max(lens)
	for _, n := range lens {
		for j := range width {
			id, m := int64(0), int64(0)
			if j < n {
				id, m = int64(5+rng.IntN(995)), 1
			}
			if j == 0 {
				id = 1
			}
			ids, mask = append(ids, id), append(mask, m)
		}
	}
	return ids, mask, width
}

// runner makes a plain ORT session for m and returns a function running
// it on a batch: the logits and, when extra is not "", that int32 tensor
// of the graph too. The session goes when t ends.
func runner(t *testing.T, m *onnxpb.ModelProto, extra string) func(ids, mask []int64, rows, width int) ([]float32, []int32) {
	t.Helper()
	outs := []string{"logits"}
	if extra != "" {
		m = proto.Clone(m).(*onnxpb.ModelProto)
		m.Graph.Output = append(m.Graph.Output, valueInfo(extra, onnxpb.TensorProto_INT32))
		outs = append(outs, extra)
	}
	data, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	so, err := ort.NewSessionOptions()
	if err != nil {
		t.Fatal(err)
	}
	defer so.Destroy()
	if err := so.SetIntraOpNumThreads(2); err != nil {
		t.Fatal(err)
	}
	sess, err := ort.NewDynamicAdvancedSessionWithONNXData(data, []string{"input_ids", "attention_mask"}, outs, so)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sess.Destroy() })
	return func(ids, mask []int64, rows, width int) ([]float32, []int32) {
		t.Helper()
		shape := ort.NewShape(int64(rows), int64(width))
		it, err := ort.NewTensor(shape, ids)
		if err != nil {
			t.Fatal(err)
		}
		defer it.Destroy()
		mt, err := ort.NewTensor(shape, mask)
		if err != nil {
			t.Fatal(err)
		}
		defer mt.Destroy()
		res := make([]ort.Value, len(outs))
		if err := sess.Run([]ort.Value{it, mt}, res); err != nil {
			t.Fatalf("run %dx%d: %v", rows, width, err)
		}
		defer func() {
			for _, v := range res {
				v.Destroy()
			}
		}()
		logits := slices.Clone(res[0].(*ort.Tensor[float32]).GetData())
		var got []int32
		if extra != "" {
			got = slices.Clone(res[1].(*ort.Tensor[int32]).GetData())
		}
		return logits, got
	}
}

// maskTerm reports whether name is computed from the mask step's key mask
// (the nodes it adds, named under scorer_relattn_mask/), not counting
// what reaches it through another MultiHeadAttention (the layer before
// it, whose output every later layer reads) or a Shape (no values).
func maskTerm(g *onnxpb.GraphProto, name string) bool {
	producer := map[string]*onnxpb.NodeProto{}
	for _, n := range g.GetNode() {
		for _, o := range n.GetOutput() {
			producer[o] = n
		}
	}
	seen := map[string]bool{}
	var walk func(string) bool
	walk = func(t string) bool {
		if t == "" || seen[t] {
			return false
		}
		seen[t] = true
		n := producer[t]
		if n == nil || n.GetOpType() == "MultiHeadAttention" || n.GetOpType() == "Shape" {
			return false
		}
		if strings.HasPrefix(n.GetName(), "scorer_relattn_mask/") {
			return true
		}
		return slices.ContainsFunc(n.GetInput(), walk)
	}
	return walk(name)
}

// mhaNodes is every MultiHeadAttention node of g.
func mhaNodes(g *onnxpb.GraphProto) []*onnxpb.NodeProto {
	var ns []*onnxpb.NodeProto
	for _, n := range g.GetNode() {
		if n.GetOpType() == "MultiHeadAttention" {
			ns = append(ns, n)
		}
	}
	return ns
}

// compareLogits fails t when two [rows][classes] logits differ by more
// than 1e-5 or pick a different class in any row, and returns the worst
// difference.
func compareLogits(t *testing.T, want, got []float32, rows int, what string) float64 {
	t.Helper()
	classes := len(want) / rows
	d := 0.0
	for r := range rows {
		w, g := want[r*classes:(r+1)*classes], got[r*classes:(r+1)*classes]
		for k := range w {
			d = math.Max(d, math.Abs(float64(w[k])-float64(g[k])))
		}
		if slices.Index(w, slices.Max(w)) != slices.Index(g, slices.Max(g)) {
			t.Errorf("%s: row %d decides differently: %v against %v", what, r, g, w)
		}
	}
	if d > 1e-5 {
		t.Errorf("%s: max |Δlogit| %.3g > 1e-5", what, d)
	}
	return d
}

var mhaBatches = [][]int{{37, 300, 5, 150}, {48, 48, 20}, {9}, {1, 64, 33, 7, 64}}

// TestMHAKeyLengths: with the default steps and mha, every layer's
// MultiHeadAttention takes the mask as the one 3B+2 key-lengths tensor
// (ONNX Runtime's form for its cutlass kernel on CUDA: key lengths, then
// the query and key starts of the padded layout), built from
// attention_mask, and its attention_bias reads nothing of
// attention_mask (c2p + p2c only); the key-lengths tensor holds each
// row's length and the starts 0, L, …, B·L; the logits are within 1e-5
// of the graph as exported on right-padded batches of rows of different
// lengths, every decision equal.
func TestMHAKeyLengths(t *testing.T) {
	for family, path := range testenv.DeBERTaGraphs(t) {
		t.Run(family, func(t *testing.T) {
			exported := readModel(t, path)
			m := proto.Clone(exported).(*onnxpb.ModelProto)
			steps, err := onnxgraph.ParseSteps(onnxgraph.DefaultAttentionRewrites + "," + onnxgraph.RewriteMHA)
			if err != nil {
				t.Fatal(err)
			}
			steps.Heads = 2
			st, err := onnxgraph.RewriteAttention(m, steps)
			if err != nil {
				t.Fatal(err)
			}
			if st.MHA.Fused != 2 || st.MHA.KeyLengths != 2 {
				t.Fatalf("%s: want both layers' attention as MultiHeadAttention masked by key lengths", st)
			}
			g := m.GetGraph()
			nodes := mhaNodes(g)
			if len(nodes) != 2 {
				t.Fatalf("%d MultiHeadAttention nodes, want 2", len(nodes))
			}
			lengths := nodes[0].GetInput()[4]
			for _, n := range nodes {
				in := n.GetInput()
				if in[4] == "" || in[4] != lengths {
					t.Errorf("%s: key_padding_mask %q, want the shared key lengths %q", n.GetName(), in[4], lengths)
				}
				if !maskTerm(g, in[4]) {
					t.Errorf("%s: key_padding_mask is not made from the key mask", n.GetName())
				}
				if len(in) < 6 || in[5] == "" {
					t.Fatalf("%s: no attention_bias (c2p + p2c)", n.GetName())
				}
				if maskTerm(g, in[5]) {
					t.Errorf("%s: attention_bias still has the key mask term", n.GetName())
				}
			}
			runExported, runRewritten := runner(t, exported, ""), runner(t, m, lengths)
			rng := rand.New(rand.NewPCG(11, 12))
			var worst float64
			for _, lens := range mhaBatches {
				ids, mask, width := paddedBatch(rng, lens)
				want, _ := runExported(ids, mask, len(lens), width)
				got, kl := runRewritten(ids, mask, len(lens), width)
				var wantKL []int32
				for _, n := range lens {
					wantKL = append(wantKL, int32(n))
				}
				for range 2 {
					for b := range len(lens) + 1 {
						wantKL = append(wantKL, int32(b*width))
					}
				}
				if !slices.Equal(kl, wantKL) {
					t.Errorf("lengths %v: key lengths %v, want %v", lens, kl, wantKL)
				}
				worst = math.Max(worst, compareLogits(t, want, got, len(lens), family))
			}
			t.Logf("%s: %s: max |Δlogit| %.3g", family, st, worst)
		})
	}
}

// TestMHAKeyLengthsFallback: where the mask bias is not the mask step's
// key mask as built (here behind an Identity, which the step does not
// look through), the mha step keeps it as the additive term of
// attention_bias and gives no key_padding_mask; the logits still match the
// graph as exported.
func TestMHAKeyLengthsFallback(t *testing.T) {
	path := testenv.DeBERTaGraphs(t)["make_deberta"]
	exported := readModel(t, path)
	m := proto.Clone(exported).(*onnxpb.ModelProto)
	steps, err := onnxgraph.ParseSteps(onnxgraph.DefaultAttentionRewrites)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := onnxgraph.RewriteAttention(m, steps); err != nil {
		t.Fatal(err)
	}
	g := m.GetGraph()
	// The mask step's bias is the one Mul by 10⁴ that the softmaxes' Adds read.
	var bias string
	for _, n := range g.GetNode() {
		if n.GetOpType() == "Softmax" {
			for _, p := range g.GetNode() {
				if p.GetOutput()[0] == n.GetInput()[0] && p.GetOpType() == "Add" {
					bias = p.GetInput()[1]
				}
			}
		}
	}
	if bias == "" {
		t.Fatal("no Softmax(scores + bias) after the mask step")
	}
	hidden := bias + "/hidden"
	for _, n := range g.GetNode() {
		for i, in := range n.GetInput() {
			if in == bias {
				n.Input[i] = hidden
			}
		}
	}
	g.Node = append(g.Node, &onnxpb.NodeProto{OpType: proto.String("Identity"), Name: proto.String(hidden),
		Input: []string{bias}, Output: []string{hidden}})
	st, err := onnxgraph.MHAStep(m, 2)
	if err != nil {
		t.Fatal(err)
	}
	if st.Fused != 2 || st.KeyLengths != 0 {
		t.Fatalf("%s: want 2 cores, the mask in their bias", st)
	}
	for _, n := range mhaNodes(g) {
		in := n.GetInput()
		if in[4] != "" {
			t.Errorf("%s: key_padding_mask %q, want none", n.GetName(), in[4])
		}
		if !maskTerm(g, in[5]) {
			t.Errorf("%s: attention_bias has no mask term", n.GetName())
		}
	}
	runExported, runRewritten := runner(t, exported, ""), runner(t, m, "")
	rng := rand.New(rand.NewPCG(13, 14))
	for _, lens := range mhaBatches {
		ids, mask, width := paddedBatch(rng, lens)
		want, _ := runExported(ids, mask, len(lens), width)
		got, _ := runRewritten(ids, mask, len(lens), width)
		compareLogits(t, want, got, len(lens), "additive fallback")
	}
}
