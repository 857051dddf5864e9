// Package onnxgraph is the one place that changes ONNX graphs: a graph's
// index (producers, readers, initializers, outputs and the reads of
// subgraphs from their enclosing scope), the builder that names what a
// rewrite adds, dead-node pruning and topological order, and the rewrites
// the model package runs at load, one file each: relattn.go (DeBERTa's
// relative attention windowed, aligned and scaled), mask.go (one additive
// key mask), skipln.go (SkipLayerNormalization), mha.go
// (MultiHeadAttention), with attention.go naming the steps and running
// them (RewriteAttention). internal/onnxfp16 reads subgraphs through the
// same OuterReads.
//
// It imports only model/onnxpb, so that model and internal/onnxfp16 can
// both import it. Graphs are changed in place and are not safe for
// concurrent use while a function here runs on them.
package onnxgraph
