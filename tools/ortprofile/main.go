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
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	ort "github.com/yalue/onnxruntime_go"

	"github.com/scorer/scorer/gpupool"
	"github.com/scorer/scorer/internal/onnxfp16"
	"github.com/scorer/scorer/internal/scoring"
	"github.com/scorer/scorer/model"
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
