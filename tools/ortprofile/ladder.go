package main

import (
	"cmp"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	ort "github.com/yalue/onnxruntime_go"
	"google.golang.org/protobuf/proto"

	"github.com/scorer/scorer/model"
	"github.com/scorer/scorer/model/onnxpb"
)

// ladderOps are the op types the ladder's table shows: what each rewrite
// removes or adds, and the products.
var ladderOps = []string{"MatMul", "FusedMatMul", "Gemm", "Add", "Div", "Where", "Softmax", "LayerNormalization",
	"SkipLayerNormalization", "MultiHeadAttention", "GatherElements", "Transpose", "Cast"}

// countLadder creates one session per rung (an ATTENTION_REWRITES value, or
// "exported") with ORT's optimised graph saved, and prints the graph's op
// counts as one Markdown table.
func countLadder(dir, name, device string, rungs []string, base model.SessionOptions, out string) error {
	fmt.Printf("%s: ORT's optimised graph (%s, all levels) per attention rewrite, each added to those above it\n\n", name, device)
	fmt.Printf("| ATTENTION_REWRITES | nodes | %s |\n|---|---:|%s\n", strings.Join(ladderOps, " | "), strings.Repeat("---:|", len(ladderOps)))
	for i, rung := range rungs {
		opts := model.LoadOptions{Dir: dir, AttentionRewrites: rung}
		if rung == "exported" {
			opts = model.LoadOptions{Dir: dir, KeepRelativeAttention: true}
		}
		optimized := filepath.Join(out, fmt.Sprintf("%s-%s-rung%d-optimized.onnx", name, device, i))
		counts, err := optimisedCounts(opts, base, optimized)
		if err != nil {
			fmt.Printf("| %s | %s |\n", rung, oneLine(err))
			continue
		}
		total := 0
		for _, c := range counts {
			total += c
		}
		var cells []string
		for _, op := range ladderOps {
			cells = append(cells, strconv.Itoa(counts[op]+counts["com.microsoft."+op]))
		}
		fmt.Printf("| %s | %d | %s |\n", rung, total, strings.Join(cells, " | "))
	}
	fmt.Println()
	return nil
}

// optimisedCounts loads a model, creates one session that saves ORT's
// optimised graph (weights beside it) and counts that graph's op types.
func optimisedCounts(lo model.LoadOptions, base model.SessionOptions, optimized string) (map[string]int, error) {
	m, err := model.Load(lo)
	if err != nil {
		return nil, err
	}
	opts := base
	opts.Configure = func(so *ort.SessionOptions) error {
		if base.Configure != nil {
			if err := base.Configure(so); err != nil {
				return err
			}
		}
		if err := so.AddSessionConfigEntry("session.optimized_model_external_initializers_file_name", filepath.Base(optimized)+".data"); err != nil {
			return err
		}
		return so.SetOptimizedModelFilePath(optimized)
	}
	s, err := m.NewSession(opts)
	if err != nil {
		return nil, err
	}
	if err := s.Close(); err != nil {
		return nil, err
	}
	defer os.Remove(optimized + ".data")
	return opTypes(optimized)
}

// opTypes counts a graph file's op types; a contrib op is named with its
// domain ("com.microsoft.FusedMatMul").
func opTypes(path string) (map[string]int, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var m onnxpb.ModelProto
	if err := proto.Unmarshal(data, &m); err != nil {
		return nil, err
	}
	counts := map[string]int{}
	for _, n := range m.GetGraph().GetNode() {
		op := n.GetOpType()
		if d := n.GetDomain(); d != "" && d != "ai.onnx" {
			op = d + "." + op
		}
		counts[op]++
	}
	return counts, nil
}

// opCounts is a graph's op types and counts, most frequent first.
func opCounts(path string) (string, error) {
	counts, err := opTypes(path)
	if err != nil {
		return "", err
	}
	ops := make([]string, 0, len(counts))
	for op := range counts {
		ops = append(ops, op)
	}
	slices.SortFunc(ops, func(a, b string) int { return cmp.Or(cmp.Compare(counts[b], counts[a]), cmp.Compare(a, b)) })
	var b strings.Builder
	for i, op := range ops {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s %d", op, counts[op])
	}
	return b.String(), nil
}
