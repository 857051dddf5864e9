package model

import (
	"math/rand/v2"
	"path/filepath"
	"strings"
	"testing"

	"github.com/scorer/scorer/internal/testenv"
	"github.com/scorer/scorer/model/onnxgraph"
)

// TestAttentionRewriteStructure checks, on each of the three DeBERTa
// families with the default rewrites, what each step promises in the
// graph: no Div reads a c2p/p2c score term (the scale moved onto the
// windows) and no Where reads or feeds a Softmax (one additive key mask
// for all layers, built once).
func TestAttentionRewriteStructure(t *testing.T) {
	for family, path := range testenv.DeBERTaGraphs(t) {
		t.Run(family, func(t *testing.T) {
			rewritten, st := rewrittenFileWith(t, path, mustParseSteps(t, ""))
			// Two layers: 2 c2p/p2c scales each, one softmax each, a
			// residual LayerNorm after attention and after the FFN.
			if st.Rel.ScalesMoved != 4 || st.Rel.Align != onnxgraph.AlignPositions || st.Mask.Softmaxes != 2 || st.Mask.Masks != 1 ||
				st.SkipLN.Fused != 4 || st.SkipLN.WithBias != 4 {
				t.Errorf("%v; want 4 scales moved, windows aligned to %d, 2 softmaxes sharing 1 mask, 4 LayerNorms fused with their bias", st, onnxgraph.AlignPositions)
			}
			for name, p := range map[string]string{"exported": path, "rewritten": rewritten} {
				g := readTestGraph(t, p)
				x := onnxgraph.NewIndex(g)
				var scoreDivs, maskWheres int
				for _, n := range g.GetNode() {
					switch n.GetOpType() {
					case "Div":
						in := n.GetInput()[0]
						if tr := x.Op(in, "Transpose"); tr != nil {
							in = tr.GetInput()[0]
						}
						if x.Op(in, "GatherElements") != nil {
							scoreDivs++
						}
					case "Softmax":
						if x.Op(n.GetInput()[0], "Where") != nil {
							maskWheres++
						}
						for _, c := range x.Consumers(n.GetOutput()[0]) {
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
// its own, so a step that is wrong cannot hide behind another. Under -short
// the default steps, each alone and together; make test also runs none and
// the mha combinations (mha is off by default; -short keeps it in
// TestAttentionMHAFamilies on the production graph).
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
		if testing.Short() && (steps == "none" || strings.Contains(steps, RewriteMHA)) {
			t.Logf("-short: %q skipped; make test runs it", steps)
			continue
		}
		t.Run(steps, func(t *testing.T) {
			parsed := mustParseSteps(t, steps)
			parsed.Heads = 2 // the fixture's num_attention_heads (README.md)
			rewritten, st := rewrittenFileWith(t, path, parsed)
			if parsed.MHA && st.MHA.Fused != 2 {
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

// TestAttentionMHAFamilies runs every rewrite with mha on the three DeBERTa
// families (each 2 layers of 2 heads, as their config.json or SOURCE.txt
// says): both layers' attention as one MultiHeadAttention, logits within
// 1e-5 of the graph as exported on padded batches past 129 tokens and
// short ones. Under -short the production graph (make_deberta) only: mha is
// off by default, and make test runs every family.
func TestAttentionMHAFamilies(t *testing.T) {
	for family, path := range testenv.DeBERTaGraphs(t) {
		if testing.Short() && family != "make_deberta" {
			t.Logf("-short: %s skipped, the production graph checked; make test runs every family", family)
			continue
		}
		t.Run(family, func(t *testing.T) {
			steps := mustParseSteps(t, DefaultAttentionRewrites+","+RewriteMHA)
			steps.Heads = 2
			rewritten, st := rewrittenFileWith(t, path, steps)
			if st.MHA.Fused != 2 {
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

// TestAttentionMHAWithoutHeads: asked for mha on a graph whose heads are not
// known (no num_attention_heads), loading keeps the attention as the other
// steps left it and says why, rather than failing: the logits still match.
func TestAttentionMHAWithoutHeads(t *testing.T) {
	path := filepath.Join("testdata", "deberta-check", "model.onnx")
	steps := mustParseSteps(t, DefaultAttentionRewrites+","+RewriteMHA) // Heads left 0
	rewritten, st := rewrittenFileWith(t, path, steps)
	if st.MHA.Fused != 0 || !strings.Contains(st.String(), "kept: MultiHeadAttention needs num_attention_heads") {
		t.Fatalf("%s: want mha kept for want of heads", st)
	}
	fx := readCheckFile(t, filepath.Join("testdata", "deberta-check", "check.json"))
	if d := maxDiff(rawLogits(t, path, fx.InputIDs, fx.Lengths), rawLogits(t, rewritten, fx.InputIDs, fx.Lengths)); d > 1e-5 {
		t.Errorf("max |Δlogit| %.3g > 1e-5", d)
	}
}
