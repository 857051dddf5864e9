package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
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

	"github.com/scorer/scorer/model"
)

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
