package model

import (
	"os"
	"path/filepath"
	"testing"

	ort "github.com/yalue/onnxruntime_go"
	"google.golang.org/protobuf/proto"

	"github.com/scorer/scorer/internal/testenv"
	"github.com/scorer/scorer/model/onnxpb"
)

// TestAttentionRewritesSurviveORT reads ONNX Runtime's own optimised graph
// (all levels, the CPU provider) of each shared DeBERTa model loaded with
// the default rewrites, and the graph as exported for contrast: ORT's
// optimisers must not undo a step. In the optimised rewritten graph no
// Where reads or feeds a Softmax, no Div reads a c2p/p2c GatherElements
// (directly or through a Transpose), and every residual LayerNorm is a
// SkipLayerNormalization (2 per layer; the embeddings' LayerNorm stays).
// The models are shared with the other rewrite tests (sharedLoad).
func TestAttentionRewritesSurviveORT(t *testing.T) {
	for _, name := range []string{"nli-deberta-v3-tiny", "nli-deberta-v3-hf-tiny"} {
		if testing.Short() && name != testenv.ProductionArch {
			t.Logf("-short: %s skipped, the production architecture checked; make test checks every shared DeBERTa model", name)
			continue
		}
		t.Run(name, func(t *testing.T) {
			dir := testenv.ModelDir(t, name)
			for _, keep := range []bool{true, false} {
				m := sharedLoad(t, LoadOptions{Dir: dir, KeepRelativeAttention: keep})
				g := optimisedGraph(t, m)
				var maskWheres, scoreDivs, skipLN, layerNorms int
				producer := map[string]*onnxpb.NodeProto{}
				for _, n := range g.GetNode() {
					for _, o := range n.GetOutput() {
						producer[o] = n
					}
				}
				opOf := func(name string) string {
					if p := producer[name]; p != nil {
						return p.GetOpType()
					}
					return ""
				}
				for _, n := range g.GetNode() {
					switch n.GetOpType() {
					case "Softmax":
						if opOf(n.GetInput()[0]) == "Where" {
							maskWheres++
						}
					case "Where":
						for _, in := range n.GetInput() {
							if opOf(in) == "Softmax" {
								maskWheres++
							}
						}
					case "Div":
						in := n.GetInput()[0]
						if opOf(in) == "Transpose" {
							in = producer[in].GetInput()[0]
						}
						if opOf(in) == "GatherElements" {
							scoreDivs++
						}
					case "SkipLayerNormalization":
						skipLN++
					case "LayerNormalization", "SimplifiedLayerNormalization":
						layerNorms++
					}
				}
				t.Logf("keep=%t: %d Wheres around softmaxes, %d Divs on score terms, %d SkipLayerNormalization, %d LayerNormalization (%s)",
					keep, maskWheres, scoreDivs, skipLN, layerNorms, m.GraphRewrite)
				if keep {
					if maskWheres == 0 || scoreDivs == 0 || skipLN != 0 {
						t.Errorf("the graph as exported: the fixture no longer shows what the rewrites remove")
					}
					continue
				}
				if maskWheres != 0 || scoreDivs != 0 || skipLN != 4 || layerNorms != 1 {
					t.Errorf("optimised rewritten graph: %d Wheres around softmaxes, %d Divs on score terms, %d SkipLayerNormalization, %d LayerNorms; want 0, 0, 4, 1",
						maskWheres, scoreDivs, skipLN, layerNorms)
				}
			}
		})
	}
}

// optimisedGraph creates a CPU session for m that saves ORT's optimised
// graph (weights beside it) and reads that graph's nodes.
func optimisedGraph(t *testing.T, m *Model) *onnxpb.GraphProto {
	t.Helper()
	path := filepath.Join(t.TempDir(), "optimised.onnx")
	s, err := m.NewSession(SessionOptions{IntraOpThreads: 1, InterOpThreads: 1, Configure: func(so *ort.SessionOptions) error {
		if err := so.AddSessionConfigEntry("session.optimized_model_external_initializers_file_name", "optimised.onnx.data"); err != nil {
			return err
		}
		return so.SetOptimizedModelFilePath(path)
	}})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var mp onnxpb.ModelProto
	if err := proto.Unmarshal(data, &mp); err != nil {
		t.Fatal(err)
	}
	return mp.GetGraph()
}
