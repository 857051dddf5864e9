package proof

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/scorer/scorer/internal/compare"
)

// deberta-v3-large's arithmetic: ~302M encoder weights, so ~0.6 GFLOP per
// token before attention, as the anchors assume (~0.66 with it).
func TestFLOPsOfDeBERTaLarge(t *testing.T) {
	s := modelShape{Hidden: 1024, Layers: 24, Heads: 16, Intermediate: 4096, Vocab: 128100, DeBERTa: true}
	if p := s.params(); p < 300e6 || p > 305e6 {
		t.Errorf("params %d, want ~302M", p)
	}
	if perToken := s.flopsPerPair(48) / 48; perToken < 0.6e9 || perToken > 0.75e9 {
		t.Errorf("%.3g FLOP per token at 48 tokens, want ~0.61e9", perToken)
	}
	// Attention's useful work: four L×L×H products per layer (QK^T, the
	// values, c2p, p2c), not c2p/p2c against all 512 relative positions
	// (which would add 2.4 GFLOP at 48 tokens).
	bert := s
	bert.DeBERTa = false
	weights := 2 * float64(s.params()) * 48
	if att, plain := s.flopsPerPair(48)-weights, bert.flopsPerPair(48)-weights; att != 2*plain || att != 24*8*48*48*1024 {
		t.Errorf("attention at 48 tokens: DeBERTa %.4g FLOP, BERT-like %.4g; want 2× and 24·8·48²·1024", att, plain)
	}
	if fp16Peak("NVIDIA H100 80GB HBM3") != 989 || fp16Peak("NVIDIA H100 PCIe") != 756 || fp16Peak("NVIDIA H200") != 989 || fp16Peak("Tesla X") != 0 {
		t.Error("fp16 peak table lookups")
	}
}

// The report reads a results folder and draws the findings docs/gpu.md
// explains: throughput against the target and the fp16 peak, the TF32
// trade from its parity and speed, whether the admission margin covers
// what CUDA takes beside the arena, calibration error, and sharing.
func TestCollectFindings(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, v any) {
		data, _ := json.Marshal(v)
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	shape := func(rows, l int, pps float64) Shape {
		return Shape{Rows: rows, Len: l, PairsPerSecond: pps, TFLOPS: pps * 30e9 / 1e12, PeakShare: pps * 30e9 / 1e12 / 989,
			ActivationBytes: 1 << 30, PredictedBytes: 1.08 * (1 << 30)}
	}
	fp16 := Bench{Model: "deberta-large", Precision: "fp16", GPU: "NVIDIA H100 80GB HBM3", FP16PeakTFLOPS: 989, MarginBytes: 512 << 20,
		IdleBytes: 1600 << 20, WeightBytes: 870 << 20, NonArenaBytes: 730 << 20,
		Shapes: []Shape{shape(2048, 48, 4500), shape(512, 256, 900)}}
	fp32 := fp16
	fp32.Precision, fp32.Shapes, fp32.NonArenaBytes = "fp32", []Shape{shape(2048, 48, 1500)}, 400<<20
	fp32.Shapes[0].PredictedBytes = 0.8 * (1 << 30) // the first GPU run's model at 48 tokens
	tf32 := fp32
	tf32.TF32, tf32.Shapes = true, []Shape{shape(2048, 48, 3000)}
	tf32.MarginMeasured, tf32.MarginBytes = true, 800<<20
	write("bench-fp16.json", fp16)
	write("bench-fp32.json", fp32)
	write("bench-fp32-tf32.json", tf32)
	write("compare-cpu-vs-cuda-fp32.json", compare.Report{Pairs: 500, MaxAbsDiff: 2e-5, Agreement: 1, Pass: true})
	write("compare-cpu-vs-cuda-fp32-tf32.json", compare.Report{Pairs: 500, MaxAbsDiff: 3e-3, Agreement: 0.998, Pass: true})
	write("share-a.json", Share{Name: "a", PairsPerSec: 2000, DevicePeakUsed: 60 << 30, DeviceTotal: 80 << 30})
	write("share-b.json", Share{Name: "b", PairsPerSec: 2100, OOMRetries: 1, DevicePeakUsed: 61 << 30, DeviceTotal: 80 << 30})
	r, err := Collect(dir)
	if err != nil {
		t.Fatal(err)
	}
	all := strings.Join(r.Findings, "\n")
	for _, want := range []string{
		"best 4500 pairs/s at 2048×48 tokens, 75% of the low end of the 6000–10000 target; 135.0 TFLOP/s = 13.7% of the fp16 peak",
		"fp16 vs fp32 (TF32 off): 3.00x",
		"TF32: 2.00x the fp32 pairs/s; max |Δp| vs CPU 0.003 with it, 2e-05 without",
		"set GPU_TF32=false here",
		"the 512 MiB admission margin does NOT cover it: raise gpupool.DefaultGPUMemMargin to ≥ 912 MiB",
		"the 512 MiB admission margin covers it",
		"largest error 8%, never under",
		"UNDER by 20% at 2048×48",
		"the 800 MiB admission counts there (measured after its workers ran) covers it",
		"sharing: 2 scorers on one GPU: FAILED",
		"parity cpu-vs-cuda-fp32: PASS, 500 pairs",
	} {
		if !strings.Contains(all, want) {
			t.Errorf("findings lack %q:\n%s", want, all)
		}
	}
	md := r.Markdown()
	if !strings.Contains(md, "| 2048 × 48 | 4500 |") || !strings.Contains(md, "## Two scorers, one GPU") || math.IsNaN(r.Benches[0].MaxRelError) {
		t.Errorf("markdown:\n%s", md)
	}
}

// The shape table has a GPU busy column read from the bench JSON's
// gpu_busy_ratio; a file from before it has none and shows a blank, not
// 0%, so an old file never reads as an idle GPU.
func TestMarkdownGPUBusy(t *testing.T) {
	busy := 0.934
	r := Report{Benches: []Bench{{Model: "m", Precision: "fp16", GPU: "H200", Shapes: []Shape{
		{Rows: 512, Len: 48, PairsPerSecond: 11666, GPUBusy: &busy},
		{Rows: 64, Len: 512, PairsPerSecond: 416},
	}}}}
	// Through JSON as gpu-proof bench writes it and report reads it.
	data, err := json.Marshal(r.Benches[0])
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(data), `"gpu_busy_ratio":0.934`) {
		t.Fatalf("bench JSON lacks gpu_busy_ratio: %s", data)
	}
	r.Benches[0] = Bench{}
	if err := json.Unmarshal(data, &r.Benches[0]); err != nil {
		t.Fatal(err)
	}
	md := r.Markdown()
	if !strings.Contains(md, "| fp16 peak | GPU busy |") || !strings.Contains(md, "| 512 × 48 | 11666 |") ||
		!strings.Contains(md, "| 0.0% | 93% |") || !strings.Contains(md, "| 0.0% |  |") {
		t.Errorf("markdown:\n%s", md)
	}
}
