package onnxgraph

import (
	"fmt"
	"slices"

	"github.com/scorer/scorer/model/onnxpb"
)

// pruneDead removes the nodes no graph output depends on.
func pruneDead(g *onnxpb.GraphProto) {
	x := NewIndex(g)
	live := map[*onnxpb.NodeProto]bool{}
	var stack []string
	for _, o := range g.GetOutput() {
		stack = append(stack, o.GetName())
	}
	seen := map[string]bool{}
	for len(stack) > 0 {
		name := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		if seen[name] {
			continue
		}
		seen[name] = true
		if n := x.producer[name]; n != nil && !live[n] {
			live[n] = true
			stack = append(stack, nodeReads(n)...)
		}
	}
	g.Node = slices.DeleteFunc(g.Node, func(n *onnxpb.NodeProto) bool { return !live[n] })
	g.ValueInfo = slices.DeleteFunc(g.ValueInfo, func(v *onnxpb.ValueInfoProto) bool { return !seen[v.GetName()] })
}

// sortTopologically orders g's nodes so each comes after what it reads,
// keeping the existing order where it already does (ONNX requires it).
func sortTopologically(g *onnxpb.GraphProto) error {
	x := NewIndex(g)
	ready := map[string]bool{"": true}
	for _, t := range g.GetInitializer() {
		ready[t.GetName()] = true
	}
	for _, in := range g.GetInput() {
		ready[in.GetName()] = true
	}
	// waiting counts each node's reads of tensors not yet computed.
	waiting := map[*onnxpb.NodeProto]int{}
	var queue []*onnxpb.NodeProto
	pos := map[*onnxpb.NodeProto]int{}
	for i, n := range g.GetNode() {
		pos[n] = i
		for _, in := range nodeReads(n) {
			if !ready[in] && x.producer[in] != nil {
				waiting[n]++
			}
		}
		if waiting[n] == 0 {
			queue = append(queue, n)
		}
	}
	var order []*onnxpb.NodeProto
	for len(queue) > 0 {
		// The earliest ready node first keeps the original order.
		k := 0
		for i, n := range queue {
			if pos[n] < pos[queue[k]] {
				k = i
			}
		}
		n := queue[k]
		queue = slices.Delete(queue, k, k+1)
		order = append(order, n)
		for _, o := range n.GetOutput() {
			seen := map[*onnxpb.NodeProto]bool{}
			for _, c := range x.consumers[o] {
				if seen[c] {
					continue
				}
				seen[c] = true
				for _, in := range nodeReads(c) {
					if in == o {
						waiting[c]--
					}
				}
				if waiting[c] == 0 {
					queue = append(queue, c)
				}
			}
		}
	}
	if len(order) != len(g.GetNode()) {
		return fmt.Errorf("graph has a cycle or an undefined input (%d of %d nodes ordered)", len(order), len(g.GetNode()))
	}
	g.Node = order
	return nil
}
