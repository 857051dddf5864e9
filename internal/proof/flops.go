package proof

import (
	"encoding/json"
	"os"
	"strings"
)

// fp16Peaks are NVIDIA's dense fp16 tensor-core peaks in TFLOP/s, by a
// name fragment NVML reports (sparsity doubles them; not counted).
var fp16Peaks = []struct {
	name   string
	tflops float64
}{
	{"H200", 989}, {"H100 NVL", 835}, {"H100 PCIe", 756}, {"H100", 989}, {"GH200", 989}, {"B200", 2250},
	{"A100", 312}, {"A800", 312}, {"L40S", 362}, {"L40", 181}, {"L4", 121}, {"A10G", 70}, {"A10", 125}, {"T4", 65},
	{"V100", 125}, {"RTX 4090", 165}, {"RTX 3090", 71},
}

func fp16Peak(name string) float64 {
	for _, p := range fp16Peaks {
		if strings.Contains(name, p.name) {
			return p.tflops
		}
	}
	return 0
}

// modelShape is what FLOPs need from config.json.
type modelShape struct {
	Hidden, Layers, Heads, Intermediate, Vocab int
	DeBERTa                                    bool
}

func readShape(dir string) (modelShape, error) {
	data, err := os.ReadFile(dir + "/config.json")
	if err != nil {
		return modelShape{}, err
	}
	var c struct {
		Hidden       int    `json:"hidden_size"`
		Layers       int    `json:"num_hidden_layers"`
		Heads        int    `json:"num_attention_heads"`
		Intermediate int    `json:"intermediate_size"`
		Vocab        int    `json:"vocab_size"`
		Type         string `json:"model_type"`
	}
	if err := json.Unmarshal(data, &c); err != nil {
		return modelShape{}, err
	}
	return modelShape{c.Hidden, c.Layers, c.Heads, c.Intermediate, c.Vocab, strings.HasPrefix(c.Type, "deberta")}, nil
}

// params is the encoder's weights (embeddings excluded): per layer four
// H×H projections and two H×I ones.
func (s modelShape) params() int64 {
	return int64(s.Layers) * (4*int64(s.Hidden)*int64(s.Hidden) + 2*int64(s.Hidden)*int64(s.Intermediate))
}

// flopsPerPair is the useful arithmetic of one pair of len tokens: 2 per
// weight per token, plus attention's two len×len×H products per layer
// (QK^T and the weighted values); DeBERTa adds two more, c2p and p2c,
// because each of its scores also reads one relative position per
// (query, key) pair. What a graph computes beyond that is not counted: the
// graph as exported multiplies every query and key against all 2·256
// relative positions (at 48 tokens 10.7× the QK^T product, ~8% of the
// pair's arithmetic), and counting it (as this did until 2026-11-26) made
// the waste issue 32's rewrite removes look like GPU utilisation, and the
// rewritten graph look slower than it is. Projecting the relative
// positions is once per batch and left out.
func (s modelShape) flopsPerPair(length int) float64 {
	l, h := float64(length), float64(s.Hidden)
	products := 2.0
	if s.DeBERTa {
		products = 4
	}
	return 2*float64(s.params())*l + float64(s.Layers)*products*2*l*l*h
}
