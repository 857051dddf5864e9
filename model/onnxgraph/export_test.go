package onnxgraph

import "github.com/scorer/scorer/model/onnxpb"

// WindowBounds is the aligned window's arithmetic alone (windowIndex),
// for TestWindowAlignment's ORT session: the nodes and constants built
// from the index idx, a site's a and its relative embeddings x, and the
// names of the window's start and end.
func WindowBounds(idx, a, x string, align int64) (nodes []*onnxpb.NodeProto, inits []*onnxpb.TensorProto, starts, ends string) {
	b := &graphBuilder{prefix: "t/"}
	ix := b.windowIndex(idx, a, x, align)
	return b.nodes, b.inits, ix.starts, ix.ends
}

// MHAStep is the mha step alone, for TestMHAKeyLengthsFallback's graph
// whose mask bias the step must not read as key lengths.
func MHAStep(m *onnxpb.ModelProto, heads int) (MHAStats, error) { return rewriteMHA(m, heads) }
