package onnxgraph

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"

	"google.golang.org/protobuf/proto"

	"github.com/scorer/scorer/model/onnxpb"
)

// signer names a tensor by how it is computed, so two index graphs built
// alike (HF computes the same relative positions in every layer) share one
// flat index. Graph inputs and initializers are named by name, Constants
// by value, nodes by type, attributes and their inputs' signatures, and a
// subgraph by its nodes with outer names replaced by their signatures.
type signer struct {
	x      *Index
	parent *signer
	memo   map[string]string
}

func newSigner(g *onnxpb.GraphProto) *signer {
	return &signer{x: NewIndex(g), memo: map[string]string{}}
}

// of is name's signature as read in this scope: made by the innermost
// scope that produces it.
func (s *signer) of(name string) string {
	for sc := s; sc != nil; sc = sc.parent {
		if n := sc.x.producer[name]; n != nil {
			return sc.node(name, n)
		}
	}
	return "value:" + name
}

func (s *signer) node(name string, n *onnxpb.NodeProto) string {
	if v, ok := s.memo[name]; ok {
		return v
	}
	var sig string
	if n.GetOpType() == "Constant" && n.GetDomain() == "" {
		b, _ := proto.MarshalOptions{Deterministic: true}.Marshal(&onnxpb.NodeProto{Attribute: n.GetAttribute()})
		sig = "const:" + hex.EncodeToString(b)
	} else {
		h := sha256.New()
		fmt.Fprintf(h, "%s|%s|%d|", n.GetDomain(), n.GetOpType(), slices.Index(n.GetOutput(), name))
		for _, in := range n.GetInput() {
			fmt.Fprintf(h, "%s,", s.of(in))
		}
		for _, a := range n.GetAttribute() {
			if a.GetG() == nil && len(a.GetGraphs()) == 0 {
				b, _ := proto.MarshalOptions{Deterministic: true}.Marshal(a)
				fmt.Fprintf(h, "|%x", b)
				continue
			}
			fmt.Fprintf(h, "|%s=", a.GetName())
			for _, sg := range append(slices.Clone(a.GetGraphs()), a.GetG()) {
				if sg == nil {
					continue
				}
				child := &signer{x: NewIndex(sg), parent: s, memo: map[string]string{}}
				for _, o := range sg.GetOutput() {
					fmt.Fprintf(h, "%s;", child.of(o.GetName()))
				}
			}
		}
		sig = hex.EncodeToString(h.Sum(nil))
	}
	s.memo[name] = sig
	return sig
}
