package model

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	ort "github.com/yalue/onnxruntime_go"
	"google.golang.org/protobuf/proto"

	"github.com/scorer/scorer/internal/testenv"
	"github.com/scorer/scorer/model/onnxgraph"
	"github.com/scorer/scorer/model/onnxpb"
)

// readTestGraph reads a graph file's nodes (weights left on disk).
func readTestGraph(t *testing.T, path string) *onnxpb.GraphProto {
	t.Helper()
	lg, err := readLeanGraph(path)
	if err != nil {
		t.Fatal(err)
	}
	return lg.m.GetGraph()
}

// rewrittenFile rewrites the graph at path as Load does and writes it, its
// weights inline again, to a file of the test's, for plain ORT sessions.
func rewrittenFile(t *testing.T, path string) (string, onnxgraph.RelAttnStats) {
	t.Helper()
	file, st := rewrittenFileWith(t, path, mustParseSteps(t, ""))
	return file, st.Rel
}

func mustParseSteps(t *testing.T, s string) onnxgraph.Steps {
	t.Helper()
	steps, err := onnxgraph.ParseSteps(s)
	if err != nil {
		t.Fatal(err)
	}
	return steps
}

// rewrittenFileWith is rewrittenFile with the attention rewrites steps.
func rewrittenFileWith(t *testing.T, path string, steps onnxgraph.Steps) (string, onnxgraph.Stats) {
	t.Helper()
	lg, err := readLeanGraph(path)
	if err != nil {
		t.Fatal(err)
	}
	st, err := onnxgraph.RewriteAttention(lg.m, steps)
	if err != nil {
		t.Fatalf("rewriting %s: %v", path, err)
	}
	src := mustRead(t, path)
	for _, init := range lg.m.GetGraph().GetInitializer() {
		if init.GetDataLocation() != onnxpb.TensorProto_EXTERNAL {
			continue
		}
		loc, off, n, err := externalRef(init)
		if err != nil || loc != filepath.Base(path) {
			t.Fatalf("%s: initializer %s is in %q (%v)", path, init.GetName(), loc, err)
		}
		init.RawData, init.ExternalData, init.DataLocation = src[off:off+n], nil, nil
	}
	b, err := proto.Marshal(lg.m)
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "rewritten.onnx")
	if err := os.WriteFile(out, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return out, st
}

// opCounts counts a graph file's node types (top level).
func opCounts(t *testing.T, path string) map[string]int {
	t.Helper()
	n := map[string]int{}
	for _, node := range readTestGraph(t, path).GetNode() {
		n[node.GetOpType()]++
	}
	return n
}

// indexExpands counts the distinct Expand nodes that feed a GatherElements
// its indices.
func indexExpands(t *testing.T, path string) int {
	t.Helper()
	g := readTestGraph(t, path)
	x := onnxgraph.NewIndex(g)
	seen := map[*onnxpb.NodeProto]bool{}
	for _, n := range g.GetNode() {
		if n.GetOpType() == "GatherElements" {
			if e := x.Op(n.GetInput()[1], "Expand"); e != nil {
				seen[e] = true
			}
		}
	}
	return len(seen)
}

// rawSessions are the plain ORT sessions rawLogits made, one per test and
// graph file: a test runs the same graph on several batches, and a session
// for one of the 32 MB DeBERTa graphs costs ORT's graph optimisations each
// time. Each is destroyed when the test that made it ends.
var rawSessions = map[rawKey]*ort.DynamicAdvancedSession{}

type rawKey struct {
	t    *testing.T
	path string
}

// rawLogits runs the graph at path on padded ids (attention mask from
// lens) with a plain ORT session (the test's for that file, rawSessions)
// and returns [rows][classes] logits.
func rawLogits(t *testing.T, path string, ids [][]int64, lens []int) [][]float32 {
	t.Helper()
	key := rawKey{t, path}
	sess := rawSessions[key]
	if sess == nil {
		so, err := ort.NewSessionOptions()
		if err != nil {
			t.Fatal(err)
		}
		defer so.Destroy()
		if err := so.SetIntraOpNumThreads(2); err != nil {
			t.Fatal(err)
		}
		if err := noSpinning.Configure(so); err != nil { // as newSession's
			t.Fatal(err)
		}
		if sess, err = ort.NewDynamicAdvancedSession(path, []string{inputIDs, inputMask}, []string{outputLogits}, so); err != nil {
			t.Fatalf("session for %s: %v", path, err)
		}
		rawSessions[key] = sess
		t.Cleanup(func() {
			delete(rawSessions, key)
			sess.Destroy()
		})
	}
	rows, width := len(ids), len(ids[0])
	flat := make([]int64, 0, rows*width)
	mask := make([]int64, 0, rows*width)
	for i, r := range ids {
		flat = append(flat, r...)
		for j := range r {
			mask = append(mask, int64(min(1, max(0, lens[i]-j))))
		}
	}
	shape := ort.NewShape(int64(rows), int64(width))
	in, err := ort.NewTensor(shape, flat)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Destroy()
	am, err := ort.NewTensor(shape, mask)
	if err != nil {
		t.Fatal(err)
	}
	defer am.Destroy()
	out := []ort.Value{nil}
	if err := sess.Run([]ort.Value{in, am}, out); err != nil {
		t.Fatalf("run %s on %dx%d: %v", path, rows, width, err)
	}
	defer out[0].Destroy()
	data := out[0].(*ort.Tensor[float32]).GetData()
	classes := len(data) / rows
	res := make([][]float32, rows)
	for i := range res {
		res[i] = append([]float32(nil), data[i*classes:(i+1)*classes]...)
	}
	return res
}

// randomBatch is rows of random ids below vocab, [CLS]=1 first, padded
// with 0 after each row's length.
func randomBatch(rng *rand.Rand, lens []int, vocab int) [][]int64 {
	width := 0
	for _, n := range lens {
		width = max(width, n)
	}
	ids := make([][]int64, len(lens))
	for i, n := range lens {
		ids[i] = make([]int64, width)
		for j := range n {
			ids[i][j] = int64(5 + rng.IntN(vocab-5))
		}
		ids[i][0] = 1
	}
	return ids
}

func maxDiff(a, b [][]float32) float64 {
	d := 0.0
	for i := range a {
		for k := range a[i] {
			d = math.Max(d, math.Abs(float64(a[i][k])-float64(b[i][k])))
		}
	}
	return d
}

// TestRelAttentionRewriteFamilies rewrites each family's graph and runs the
// original and the rewritten graph in plain ORT sessions on random ids:
// make_deberta.py's --check shapes (lengths 300, 150, 37, 5 padded in one
// batch, and each row alone: the 300-token row reads log buckets past 129
// tokens) and a short batch (identity buckets only). Logits must agree
// within 1e-5, and the rewritten graph must have no Tile or GatherElements
// left.
func TestRelAttentionRewriteFamilies(t *testing.T) {
	for family, path := range testenv.DeBERTaGraphs(t) {
		if testing.Short() && family == "hf-torchscript" {
			t.Logf("-short: %s skipped, the production graph (make_deberta) and another exporter's (hf-dynamo) checked; under -short TestRelAttentionHFLogits holds the rewritten HF export to HF torch's logits, and make test runs every family", family)
			continue
		}
		t.Run(family, func(t *testing.T) {
			rewritten, st := rewrittenFile(t, path)
			// Two layers, each with a c2p and a p2c gather.
			if st.Gathers != 4 || st.TilesLeft != 0 {
				t.Errorf("stats %+v; want 4 gathers, no Tile left", st)
			}
			// One index Expand per distinct index replaces the Expands
			// of the gathers (one per gather, or dynamo's shared ones).
			before, after := opCounts(t, path), opCounts(t, rewritten)
			expBefore, expAfter := indexExpands(t, path), indexExpands(t, rewritten)
			if before["GatherElements"] != 4 || after["GatherElements"] != 4 || before["Tile"] != 4 || after["Tile"] != 0 || expAfter != st.Indices {
				t.Errorf("GatherElements %d -> %d, Tile %d -> %d, index Expands %d -> %d with %d indices; want 4 -> 4, 4 -> 0, one Expand per index",
					before["GatherElements"], after["GatherElements"], before["Tile"], after["Tile"], expBefore, expAfter, st.Indices)
			}
			t.Logf("%s: %v; nodes %v -> %v", family, st, before, after)

			rng := rand.New(rand.NewPCG(1, 2))
			var worst float64
			check := func(lens []int) {
				ids := randomBatch(rng, lens, 1000) // the dynamo fixture's vocabulary
				want, got := rawLogits(t, path, ids, lens), rawLogits(t, rewritten, ids, lens)
				d := maxDiff(want, got)
				worst = math.Max(worst, d)
				if d > 1e-5 {
					t.Errorf("lengths %v: max |Δlogit| %.3g > 1e-5\n original  %v\n rewritten %v", lens, d, want, got)
				}
			}
			lens := []int{300, 150, 37, 5}
			check(lens)
			for _, n := range lens {
				check([]int{n})
			}
			check([]int{48, 48, 20})
			t.Logf("%s: max |Δlogit| rewritten vs original %.3g", family, worst)
		})
	}
}

// TestRelAttentionPairs loads every shared DeBERTa model with and without
// the rewrite, in both pair encodings, and compares the session logits of
// real pairs (short ones, and long premises past 129 tokens) within 1e-5.
// The models are shared (sharedLoad): the rewritten pair-encoding one is
// the default load, the others are what TestAttentionRewritesSurviveORT,
// TestRelAttentionHFLogits and TestGoldenJoined load with the same options.
func TestRelAttentionPairs(t *testing.T) {
	var sentences []string
	for _, ev := range testenv.FirstTranscripts(t, 2, 6) {
		for _, sec := range ev.Sections {
			sentences = append(sentences, sec...)
		}
	}
	long := strings.Join(sentences, " ")
	sentences = append(sentences, long, long[:len(long)/3])
	for _, name := range []string{"nli-deberta-v3-tiny", "nli-deberta-v3-hf-tiny"} {
		for _, enc := range []PairEncoding{EncodePair, EncodeJoined} {
			if testing.Short() && (name != testenv.ProductionArch || enc != EncodePair) {
				t.Logf("-short: %s/%s skipped, the production model in the production encoding checked; under -short TestRelAttentionHFLogits holds the rewritten HF export to HF torch's logits and TestRelAttentionRewriteFamilies compares the families' graphs, and make test runs every model in both encodings", name, enc)
				continue
			}
			t.Run(fmt.Sprintf("%s/%s", name, enc), func(t *testing.T) {
				dir := testenv.ModelDir(t, name)
				// Pair is the default encoding: the default load.
				opts := LoadOptions{Dir: dir}
				if enc != EncodePair {
					opts.PairEncoding = enc
				}
				on := sharedLoad(t, opts)
				opts.KeepRelativeAttention = true
				off := sharedLoad(t, opts)
				if on.PairEncoding != enc || off.PairEncoding != enc {
					t.Fatalf("pair encodings %s and %s, want %s", on.PairEncoding, off.PairEncoding, enc)
				}
				if !on.relAttn || !strings.HasPrefix(on.GraphRewrite, "relative attention rewritten") {
					t.Fatalf("default load did not rewrite: %q", on.GraphRewrite)
				}
				if off.relAttn || !strings.Contains(off.GraphRewrite, "off") {
					t.Fatalf("KeepRelativeAttention load: %q", off.GraphRewrite)
				}
				pairs := make([]Pair, len(sentences))
				longest := 0
				for i, s := range sentences {
					p, err := on.EncodeText(s, "This text is about consumer weakness.")
					if err != nil {
						t.Fatal(err)
					}
					pairs[i] = p
					longest = max(longest, len(p.IDs))
				}
				if longest <= 129 {
					t.Fatalf("longest pair %d tokens: the log buckets are not exercised", longest)
				}
				want, _ := scoreSortedBatches(t, newSession(t, off), off, pairs)
				got, _ := scoreSortedBatches(t, newSession(t, on), on, pairs)
				d := maxDiff(want, got)
				if d > 1e-5 {
					t.Errorf("max |Δlogit| rewritten vs as exported %.3g > 1e-5", d)
				}
				t.Logf("%d pairs up to %d tokens: max |Δlogit| %.3g (%s)", len(pairs), longest, d, on.GraphRewrite)
			})
		}
	}
}

// checkFile is make_deberta.py's --check file, the form hf-logits.json
// shares: a batch of random ids padded with 0, torch's logits for it
// padded (Logits) and for each row alone (RowLogits).
type checkFile struct {
	Lengths   []int       `json:"lengths"`
	InputIDs  [][]int64   `json:"input_ids"`
	Logits    [][]float64 `json:"logits"`
	RowLogits [][]float64 `json:"row_logits"`
}

func readCheckFile(t *testing.T, path string) checkFile {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var c checkFile
	if err := json.Unmarshal(data, &c); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if len(c.Lengths) == 0 || len(c.InputIDs) != len(c.Lengths) || len(c.Logits) != len(c.Lengths) || len(c.RowLogits) != len(c.Lengths) {
		t.Fatalf("%s: %d lengths, %d rows of ids, %d and %d rows of logits", path, len(c.Lengths), len(c.InputIDs), len(c.Logits), len(c.RowLogits))
	}
	return c
}

// TestRelAttentionHFLogits scores hf-logits.json's rows (lengths 300, 150,
// 37, 5; padded in one batch and each alone) through Session.Logits with
// and without the rewrite: within 1e-4 of HF torch's own logits.
func TestRelAttentionHFLogits(t *testing.T) {
	dir := testenv.ModelDir(t, "nli-deberta-v3-hf-tiny")
	ref := readCheckFile(t, filepath.Join(dir, "hf-logits.json"))
	pairs := make([]Pair, len(ref.Lengths))
	for i, n := range ref.Lengths {
		ids := make([]int32, n)
		for j := range ids {
			ids[j] = int32(ref.InputIDs[i][j])
		}
		pairs[i] = Pair{IDs: ids, TypeIDs: make([]int32, n)}
	}
	for _, keep := range []bool{false, true} {
		t.Run(fmt.Sprintf("keep=%t", keep), func(t *testing.T) {
			m := sharedLoad(t, LoadOptions{Dir: dir, KeepRelativeAttention: keep})
			if m.relAttn == keep {
				t.Fatalf("rewritten %t with KeepRelativeAttention %t: %s", m.relAttn, keep, m.GraphRewrite)
			}
			s := newSession(t, m)
			batch, err := s.Logits(t.Context(), pairs)
			if err != nil {
				t.Fatal(err)
			}
			var worst float64
			for i := range pairs {
				row, err := s.Logits(t.Context(), pairs[i:i+1])
				if err != nil {
					t.Fatal(err)
				}
				for k := range ref.Logits[i] {
					for _, c := range []struct {
						what      string
						got, want float64
					}{{"padded", float64(batch[i][k]), ref.Logits[i][k]}, {"alone", float64(row[0][k]), ref.RowLogits[i][k]}} {
						d := math.Abs(c.got - c.want)
						worst = math.Max(worst, d)
						if d > 1e-4 {
							t.Errorf("row %d (%d tokens, %s) logit %d: %v, HF %v", i, ref.Lengths[i], c.what, k, c.got, c.want)
						}
					}
				}
			}
			t.Logf("max |Δlogit| vs HF torch %.3g (%s)", worst, m.GraphRewrite)
		})
	}
}

// TestRelAttentionUnrecognised: a graph without the pattern (a BERT model)
// and a DeBERTa graph whose pattern is broken by an extra node both come
// back untouched, and the model loads its own file.
func TestRelAttentionUnrecognised(t *testing.T) {
	m := sharedModel(t, testenv.ModelDir(t, "nli-unigram-small"))
	if m.relAttn || !strings.Contains(m.GraphRewrite, onnxgraph.ErrNoRelAttention.Error()) {
		t.Errorf("BERT model: rewritten %t, %q", m.relAttn, m.GraphRewrite)
	}
	newSession(t, m)

	lg, err := readLeanGraph(testenv.DeBERTaGraphs(t)["hf-torchscript"])
	if err != nil {
		t.Fatal(err)
	}
	g := lg.m.GetGraph()
	// An Identity between every Tile and its readers: same maths, a shape
	// the matcher does not know.
	var nodes []*onnxpb.NodeProto
	for _, n := range g.GetNode() {
		nodes = append(nodes, n)
		if n.GetOpType() == "Tile" {
			out := n.GetOutput()[0]
			n.Output[0] = out + "/pre_identity"
			nodes = append(nodes, &onnxpb.NodeProto{OpType: proto.String("Identity"), Input: []string{n.Output[0]}, Output: []string{out}})
		}
	}
	g.Node = nodes
	before := proto.Clone(g)
	if _, err := onnxgraph.RewriteAttention(lg.m, mustParseSteps(t, "")); !errors.Is(err, onnxgraph.ErrNoRelAttention) {
		t.Fatalf("rewrite of a broken pattern: %v; want ErrNoRelAttention", err)
	}
	if !proto.Equal(before, g) {
		t.Error("an unrecognised graph was changed")
	}
}

// TestRelAttentionCheckFixture runs make_deberta.py's --check fixture
// (testdata/deberta-check: lengths 300, 150, 37, 5, padded in one batch
// and each row alone) through the original and the rewritten graph:
// within 1e-5 of each other, and both within 1e-4 of torch's logits.
func TestRelAttentionCheckFixture(t *testing.T) {
	dir := filepath.Join("testdata", "deberta-check")
	fx := readCheckFile(t, filepath.Join(dir, "check.json"))
	path := filepath.Join(dir, "model.onnx")
	rewritten, st := rewrittenFile(t, path)
	if st.Gathers != 4 {
		t.Errorf("stats %+v; want 4 gathers", st)
	}
	toF32 := func(rows [][]float64) [][]float32 {
		out := make([][]float32, len(rows))
		for i, r := range rows {
			for _, v := range r {
				out[i] = append(out[i], float32(v))
			}
		}
		return out
	}
	var worstRewrite, worstTorch float64
	compare := func(what string, ids [][]int64, lens []int, torch [][]float32) {
		orig, got := rawLogits(t, path, ids, lens), rawLogits(t, rewritten, ids, lens)
		if d := maxDiff(orig, got); d > 1e-5 {
			t.Errorf("%s: rewritten vs original max |Δlogit| %.3g > 1e-5", what, d)
		} else {
			worstRewrite = math.Max(worstRewrite, d)
		}
		for _, c := range [][][]float32{orig, got} {
			if d := maxDiff(c, torch); d > 1e-4 {
				t.Errorf("%s: ORT vs torch max |Δlogit| %.3g > 1e-4", what, d)
			} else {
				worstTorch = math.Max(worstTorch, d)
			}
		}
	}
	compare("padded batch", fx.InputIDs, fx.Lengths, toF32(fx.Logits))
	rows := toF32(fx.RowLogits)
	for i, n := range fx.Lengths {
		compare(fmt.Sprintf("row %d alone (%d tokens)", i, n), [][]int64{fx.InputIDs[i][:n]}, []int{n}, rows[i:i+1])
	}
	t.Logf("max |Δlogit|: rewritten vs original %.3g, ORT vs torch %.3g", worstRewrite, worstTorch)
}
