// Command ortprofile measures where ONNX Runtime spends a model's time, per
// op type, with the relative-attention rewrite (model/onnxgraph/relattn.go) off and on:
// it runs batches of synthetic pairs through the scorer's own session
// (model.Load, Model.NewSession) with ORT's per-node profiler on, sums each
// kernel's time and output bytes by op type and, for DeBERTa graphs, over the
// relative-position path (the nodes the rewrite removes, against the ones it
// adds). It also saves ORT's optimised graph of each variant (weights kept
// outside it) and counts its op types, so what ORT's fusions leave unfused is
// visible; --fp16 does the same for the float16 twin (internal/onnxfp16).
// Before the profiles it counts the optimised graph's ops once per attention
// rewrite, each added to the ones before it (ATTENTION_REWRITES, model/onnxgraph's
// attention.go), so every step is seen landing even where no GPU is at
// hand; -device cuda runs all of it on the CUDA provider with the options
// the pool's sessions use. `make bench-profile` runs it on the
// production-size stand-in.
//
//	ortprofile -model DIR [-rows 8] [-lens 48,512] [-runs 3] [-threads 2] [-fp16] [-device cpu|cuda] [-out DIR]
package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	ort "github.com/yalue/onnxruntime_go"
	"google.golang.org/protobuf/proto"

	"github.com/scorer/scorer/gpupool"
	"github.com/scorer/scorer/internal/onnxfp16"
	"github.com/scorer/scorer/internal/scoring"
	"github.com/scorer/scorer/model"
	"github.com/scorer/scorer/model/onnxpb"
)

func main() {
	dir := flag.String("model", "", "model folder (required)")
	rows := flag.Int("rows", 8, "pairs per batch")
	lens := flag.String("lens", "48,512", "comma-separated pair lengths in tokens; each is one profiled shape")
	runs := flag.Int("runs", 3, "batches per shape and variant (the first, with ORT's set-up, included)")
	threads := flag.Int("threads", 2, "ORT intra-op threads")
	fp16 := flag.Bool("fp16", false, "also profile the float16 twin of model.onnx (written to -out)")
	out := flag.String("out", "", "folder for the profiles and optimised graphs; empty = a temporary one, removed")
	ortLib := flag.String("ort-lib", os.Getenv("ORT_LIB"), "ONNX Runtime library")
	device := flag.String("device", "cpu", "cpu, or cuda (GPU 0, the pool's CUDA session options; needs ONNX Runtime's CUDA set as -ort-lib)")
	ladder := flag.String("steps", defaultLadder, "semicolon-separated ATTENTION_REWRITES values whose optimised graphs are counted, \"exported\" for the graph as exported; empty = none")
	flag.Parse()
	if *dir == "" || (*device != "cpu" && *device != "cuda") {
		flag.Usage()
		os.Exit(2)
	}
	base, err := sessionBase(*device, *threads)
	if err == nil {
		err = run(*dir, *rows, *lens, *runs, *threads, *fp16, *out, *ortLib, *device, *ladder, base)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "ortprofile:", err)
		os.Exit(1)
	}
}

// defaultLadder adds the attention rewrites one at a time.
const defaultLadder = "exported;none;align;align,scale;align,scale,mask;align,scale,mask,skipln;align,scale,mask,skipln,mha"

// sessionBase is the session options every session here starts from: the
// CPU with threads intra-op threads, or what the pool gives a CUDA session
// on GPU 0.
func sessionBase(device string, threads int) (model.SessionOptions, error) {
	if device == "cuda" {
		return gpupool.ModelSessionOptions(gpupool.Device{Kind: gpupool.CUDA}, gpupool.SessionConfig{})
	}
	return model.SessionOptions{IntraOpThreads: threads, InterOpThreads: 1}, nil
}

func run(dir string, rows int, lensFlag string, runs, threads int, fp16 bool, out, ortLib, device, ladder string, base model.SessionOptions) error {
	var lens []int
	for f := range strings.SplitSeq(lensFlag, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 2 {
			return fmt.Errorf("-lens: %q", f)
		}
		lens = append(lens, n)
	}
	if out == "" {
		tmp, err := os.MkdirTemp("", "ortprofile-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(tmp)
		out = tmp
	} else if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	shutdown, err := scoring.InitORT(ortLib)
	if err != nil {
		return err
	}
	defer shutdown()

	type graph struct{ name, dir string }
	graphs := []graph{{"fp32", dir}}
	if fp16 {
		d, err := fp16Dir(dir, out)
		if err != nil {
			return err
		}
		graphs = append(graphs, graph{"fp16", d})
	}
	fmt.Printf("ortprofile: %s, %d rows per batch, %d runs per shape, %d intra-op threads, device %s, ONNX Runtime %s, %s\n\n",
		dir, rows, runs, threads, device, ort.GetVersion(), time.Now().UTC().Format(time.RFC3339))
	for _, gr := range graphs {
		if ladder != "" {
			if err := countLadder(gr.dir, gr.name, device, strings.Split(ladder, ";"), base, out); err != nil {
				return fmt.Errorf("%s: %w", gr.name, err)
			}
		}
	}
	for _, gr := range graphs {
		for _, keep := range []bool{true, false} {
			variant := fmt.Sprintf("%s-%s", gr.name, map[bool]string{true: "exported", false: "rewritten"}[keep])
			if err := profileVariant(gr.dir, variant, keep, lens, rows, runs, base, out); err != nil {
				return fmt.Errorf("%s: %w", variant, err)
			}
		}
	}
	return nil
}

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

func oneLine(err error) string {
	msg := strings.ReplaceAll(err.Error(), "\n", " ")
	if len(msg) > 160 {
		msg = msg[:160] + "…"
	}
	return "not loaded: " + msg
}

// fp16Dir makes a model folder beside out whose model.onnx is the float16
// twin of dir's (tokenizer and config linked).
func fp16Dir(dir, out string) (string, error) {
	d := filepath.Join(out, "fp16-model")
	if err := os.MkdirAll(d, 0o755); err != nil {
		return "", err
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return "", err
	}
	for _, e := range entries {
		if e.IsDir() || e.Name() == "model.onnx" {
			continue
		}
		link := filepath.Join(d, e.Name())
		os.Remove(link)
		abs, err := filepath.Abs(filepath.Join(dir, e.Name()))
		if err != nil {
			return "", err
		}
		if err := os.Symlink(abs, link); err != nil {
			return "", err
		}
	}
	if _, err := os.Stat(filepath.Join(d, "model.onnx")); err == nil {
		return d, nil // converted by an earlier run into the same -out
	}
	if _, err := onnxfp16.ConvertFile(filepath.Join(dir, "model.onnx"), filepath.Join(d, "model.onnx"), onnxfp16.Options{KeepIOTypes: true}); err != nil {
		return "", err
	}
	return d, nil
}

// opStat is one op type's (or the relative-position path's) total.
type opStat struct {
	calls  int
	micros int64
	bytes  int64
}

func profileVariant(dir, variant string, keep bool, lens []int, rows, runs int, base model.SessionOptions, out string) error {
	m, err := model.Load(model.LoadOptions{Dir: dir, KeepRelativeAttention: keep})
	if err != nil {
		return err
	}
	var removed map[string]bool
	prefix := ""
	if names, p, err := model.RelAttentionNodes(m.ONNXPath); err == nil {
		removed, prefix = map[string]bool{}, p
		for _, n := range names {
			removed[n] = true
		}
	} else if !keep {
		fmt.Printf("%s: %s\n", variant, m.GraphRewrite)
	}
	fmt.Printf("### %s: %s\n\n", variant, m.GraphRewrite)
	optimized := filepath.Join(out, variant+"-optimized.onnx")
	for i, n := range lens {
		profPrefix := filepath.Join(out, fmt.Sprintf("%s-len%d", variant, n))
		opts := base
		opts.Configure = func(so *ort.SessionOptions) error {
			if base.Configure != nil {
				if err := base.Configure(so); err != nil {
					return err
				}
			}
			if i == 0 {
				// The weights go beside the optimised graph, so it stays
				// small enough to read back.
				if err := so.AddSessionConfigEntry("session.optimized_model_external_initializers_file_name", filepath.Base(optimized)+".data"); err != nil {
					return err
				}
				if err := so.SetOptimizedModelFilePath(optimized); err != nil {
					return err
				}
			}
			return so.EnableProfiling(profPrefix)
		}
		s, err := m.NewSession(opts)
		if err != nil {
			return err
		}
		rng := rand.New(rand.NewPCG(uint64(n), 1))
		pairs := make([]model.Pair, rows)
		for r := range pairs {
			ids := make([]int32, n)
			for j := range ids {
				ids[j] = int32(5 + rng.IntN(995))
			}
			ids[0] = 1
			pairs[r] = model.Pair{IDs: ids, TypeIDs: make([]int32, n)}
		}
		start := time.Now()
		for range runs {
			if _, err := s.Logits(context.Background(), pairs); err != nil {
				s.Close()
				return err
			}
		}
		wall := time.Since(start)
		if err := s.Close(); err != nil { // writes the profile
			return err
		}
		files, _ := filepath.Glob(profPrefix + "*.json")
		if len(files) == 0 {
			return fmt.Errorf("no profile written under %s", profPrefix)
		}
		slices.Sort(files)
		byOp, rel, err := readProfile(files[len(files)-1], removed, prefix)
		if err != nil {
			return err
		}
		printProfile(variant, n, rows, runs, wall, byOp, rel, removed != nil)
	}
	counts, err := opCounts(optimized)
	if err != nil {
		return fmt.Errorf("reading the optimised graph: %w", err)
	}
	fmt.Printf("%s: ORT's optimised graph (all levels), op types: %s\n\n", variant, counts)
	return nil
}

// readProfile sums ORT's profile (a JSON array of trace events; each
// kernel's is "NODE_kernel_time" with args op_name and output_size) by op
// type and over the relative-position path.
func readProfile(path string, removed map[string]bool, prefix string) (map[string]*opStat, opStat, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, opStat{}, err
	}
	var events []struct {
		Cat  string `json:"cat"`
		Name string `json:"name"`
		Dur  int64  `json:"dur"`
		Args struct {
			OpName     string `json:"op_name"`
			OutputSize string `json:"output_size"`
		} `json:"args"`
	}
	if err := json.Unmarshal(data, &events); err != nil {
		return nil, opStat{}, fmt.Errorf("%s: %w", path, err)
	}
	byOp := map[string]*opStat{}
	var rel opStat
	for _, e := range events {
		node, ok := strings.CutSuffix(e.Name, "_kernel_time")
		if e.Cat != "Node" || !ok {
			continue
		}
		b, _ := strconv.ParseInt(e.Args.OutputSize, 10, 64)
		st := byOp[e.Args.OpName]
		if st == nil {
			st = &opStat{}
			byOp[e.Args.OpName] = st
		}
		st.calls++
		st.micros += e.Dur
		st.bytes += b
		if isRelNode(node, removed, prefix) {
			rel.calls++
			rel.micros += e.Dur
			rel.bytes += b
		}
	}
	if len(byOp) == 0 {
		return nil, rel, errors.New("profile has no kernel events")
	}
	return byOp, rel, nil
}

// isRelNode: a node the rewrite removes or adds. ORT names a fused node
// after one it replaced plus a suffix ("…/MatMul_1/MatmulTransposeFusion/"),
// so a removed name followed by "/" or "_" counts too.
func isRelNode(node string, removed map[string]bool, prefix string) bool {
	if prefix != "" && strings.HasPrefix(node, prefix) {
		return true
	}
	if removed[node] {
		return true
	}
	for i := len(node) - 1; i > 0; i-- {
		if (node[i] == '_' || node[i] == '/') && removed[node[:i]] {
			return true
		}
	}
	return false
}

func printProfile(variant string, n, rows, runs int, wall time.Duration, byOp map[string]*opStat, rel opStat, hasRel bool) {
	var total opStat
	ops := make([]string, 0, len(byOp))
	for op, st := range byOp {
		ops = append(ops, op)
		total.calls += st.calls
		total.micros += st.micros
		total.bytes += st.bytes
	}
	slices.SortFunc(ops, func(a, b string) int { return cmp.Compare(byOp[b].micros, byOp[a].micros) })
	fmt.Printf("%s, %d rows x %d tokens, %d runs: wall %.0f ms per run, kernels %.0f ms per run, output %.1f MiB per run\n\n",
		variant, rows, n, runs, float64(wall.Milliseconds())/float64(runs), float64(total.micros)/1e3/float64(runs), float64(total.bytes)/(1<<20)/float64(runs))
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(w, "op type\tcalls/run\tms/run\ttime %\toutput MiB/run\tbytes %\t")
	row := func(name string, st opStat) {
		fmt.Fprintf(w, "%s\t%d\t%.1f\t%.1f\t%.1f\t%.1f\t\n", name, st.calls/runs, float64(st.micros)/1e3/float64(runs),
			100*float64(st.micros)/float64(max(total.micros, 1)), float64(st.bytes)/(1<<20)/float64(runs), 100*float64(st.bytes)/float64(max(total.bytes, 1)))
	}
	for i, op := range ops {
		if i == 15 {
			var rest opStat
			for _, o := range ops[i:] {
				rest.calls += byOp[o].calls
				rest.micros += byOp[o].micros
				rest.bytes += byOp[o].bytes
			}
			row(fmt.Sprintf("(%d other op types)", len(ops)-i), rest)
			break
		}
		row(op, *byOp[op])
	}
	row("all", total)
	if hasRel {
		row("relative-position path", rel)
	}
	w.Flush()
	fmt.Println()
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
