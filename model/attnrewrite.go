package model

import "github.com/scorer/scorer/model/onnxgraph"

// The graph rewrites Load runs live in model/onnxgraph, one file each
// (relattn.go, mask.go, skipln.go, mha.go; attention.go runs them); model
// names them for the settings (ATTENTION_REWRITES, internal/config) and
// the tools, and reads and writes the graph around them (graphfile.go).
const (
	// RewriteAlign widens each window of relative positions to a
	// multiple of 8 (onnxgraph.RewriteAlign).
	RewriteAlign = onnxgraph.RewriteAlign
	// RewriteScale moves the score terms' Div onto the windows
	// (onnxgraph.RewriteScale).
	RewriteScale = onnxgraph.RewriteScale
	// RewriteMask replaces each layer's Where → Softmax → Where by one
	// additive key mask for all layers (onnxgraph.RewriteMask).
	RewriteMask = onnxgraph.RewriteMask
	// RewriteSkipLayerNorm fuses each residual Add (and the dense
	// product's bias) with its LayerNorm (onnxgraph.RewriteSkipLayerNorm).
	RewriteSkipLayerNorm = onnxgraph.RewriteSkipLayerNorm
	// RewriteMHA runs each layer's attention core as ONNX Runtime's
	// MultiHeadAttention (onnxgraph.RewriteMHA); it needs mask and is not
	// on by default until a GPU says it pays.
	RewriteMHA = onnxgraph.RewriteMHA
)

// DefaultAttentionRewrites is every attention rewrite that is on unless a
// setting says otherwise.
const DefaultAttentionRewrites = onnxgraph.DefaultAttentionRewrites

// AttentionRewriteNames is every rewrite ParseAttentionRewrites knows.
var AttentionRewriteNames = onnxgraph.AttentionRewriteNames

// ParseAttentionRewrites checks a comma-separated list of rewrite names
// (AttentionRewriteNames; "none" for none, "" for the defaults) and returns
// it in a canonical order.
func ParseAttentionRewrites(s string) (string, error) {
	return onnxgraph.ParseAttentionRewrites(s)
}
