package onnxgraph

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/scorer/scorer/model/onnxpb"
)

// The attention rewrites run at load beside the relative-attention one
// (relattn.go), on the graphs it recognises, each by name so that a
// setting (ATTENTION_REWRITES) can leave any of them out and `scorer
// compare` can A/B one: the same logits within 1e-5 in float32 either way
// (model's relattn_test.go and attnrewrite_test.go).
const (
	// RewriteAlign widens each window of relative positions to a
	// multiple of 8 (relAttnOptions.align).
	RewriteAlign = "align"
	// RewriteScale moves the score terms' Div onto the windows
	// (relAttnOptions.scale).
	RewriteScale = "scale"
	// RewriteMask replaces each layer's Where → Softmax → Where by one
	// additive key mask for all layers (mask.go).
	RewriteMask = "mask"
	// RewriteSkipLayerNorm fuses each residual Add (and the dense
	// product's bias) with its LayerNorm (skipln.go).
	RewriteSkipLayerNorm = "skipln"
	// RewriteMHA runs each layer's attention core as ONNX Runtime's
	// MultiHeadAttention (mha.go); it needs mask and is not on by
	// default until a GPU says it pays.
	RewriteMHA = "mha"
)

// DefaultAttentionRewrites is every attention rewrite that is on unless a
// setting says otherwise.
const DefaultAttentionRewrites = RewriteAlign + "," + RewriteScale + "," + RewriteMask + "," + RewriteSkipLayerNorm

// AttentionRewriteNames is every rewrite ParseAttentionRewrites knows.
var AttentionRewriteNames = []string{RewriteAlign, RewriteScale, RewriteMask, RewriteSkipLayerNorm, RewriteMHA}

// AlignPositions is the multiple RewriteAlign widens windows to: fp16
// tensor-core GEMMs want every dimension a multiple of 8.
const AlignPositions = 8

// Steps is a parsed ATTENTION_REWRITES: which rewrites RewriteAttention
// runs after the relative-attention one.
type Steps struct {
	Align, Scale, Mask, SkipLN, MHA bool
	// Heads is config.json's num_attention_heads (0: not stated), which
	// MHA needs.
	Heads int
}

// ParseAttentionRewrites checks a comma-separated list of rewrite names
// (AttentionRewriteNames; "none" for none, "" for the defaults) and returns
// it in a canonical order.
func ParseAttentionRewrites(s string) (string, error) {
	st, err := ParseSteps(s)
	if err != nil {
		return "", err
	}
	return st.String(), nil
}

// ParseSteps parses a list as ParseAttentionRewrites does; Heads is left
// 0 for the caller to set.
func ParseSteps(s string) (Steps, error) {
	if strings.TrimSpace(s) == "" {
		s = DefaultAttentionRewrites
	}
	var st Steps
	for f := range strings.SplitSeq(s, ",") {
		switch strings.TrimSpace(f) {
		case RewriteAlign:
			st.Align = true
		case RewriteScale:
			st.Scale = true
		case RewriteMask:
			st.Mask = true
		case RewriteSkipLayerNorm:
			st.SkipLN = true
		case RewriteMHA:
			st.MHA = true
		case "none":
		default:
			return st, fmt.Errorf("unknown attention rewrite %q (known: %s, or none)", f, strings.Join(AttentionRewriteNames, ", "))
		}
	}
	if st.MHA && !st.Mask {
		return st, fmt.Errorf("attention rewrite %s needs %s", RewriteMHA, RewriteMask)
	}
	return st, nil
}

// String is the steps as a canonical ATTENTION_REWRITES ("none" for
// none).
func (st Steps) String() string {
	var on []string
	for _, s := range []struct {
		on   bool
		name string
	}{{st.Align, RewriteAlign}, {st.Scale, RewriteScale}, {st.Mask, RewriteMask}, {st.SkipLN, RewriteSkipLayerNorm}, {st.MHA, RewriteMHA}} {
		if s.on {
			on = append(on, s.name)
		}
	}
	if len(on) == 0 {
		return "none"
	}
	return strings.Join(on, ",")
}

// Stats is what RewriteAttention did.
type Stats struct {
	// Rel is the relative-attention rewrite's counts, align and scale
	// included.
	Rel RelAttnStats
	// Mask, SkipLN and MHA are those steps' counts; Kept says why a step
	// asked for changed nothing.
	Mask   MaskStats
	SkipLN SkipLNStats
	MHA    MHAStats
	Kept   []error
}

// String is the one log line saying what was done.
func (s Stats) String() string {
	done := []string{"relative attention rewritten: " + s.Rel.String()}
	if s.Mask.Softmaxes > 0 {
		done = append(done, s.Mask.String())
	}
	if s.SkipLN.Fused > 0 {
		done = append(done, s.SkipLN.String())
	}
	if s.MHA.Fused > 0 {
		done = append(done, s.MHA.String())
	}
	for _, err := range s.Kept {
		done = append(done, "kept: "+err.Error())
	}
	return strings.Join(done, "; ")
}

// RewriteAttention runs the relative-attention rewrite and then the steps
// asked for, on m's graph in place. A graph the relative-attention rewrite
// does not recognise comes back untouched with ErrNoRelAttention; the
// other steps then do not run (they are DeBERTa's). Any other error may
// leave the graph half changed: read it again to run it as exported.
func RewriteAttention(m *onnxpb.ModelProto, steps Steps) (Stats, error) {
	var st Stats
	g, opset := m.GetGraph(), defaultOpset(m)
	opts := relAttnOptions{scale: steps.Scale}
	if steps.Align {
		opts.align = AlignPositions
	}
	var err error
	if st.Rel, err = rewriteRelAttention(g, opset, opts); err != nil {
		return st, err
	}
	if steps.Mask {
		st.Mask, err = rewriteMask(g, opset)
		if err = st.keep("mask", err, errNoMaskedSoftmax); err != nil {
			return st, err
		}
	}
	if steps.SkipLN {
		st.SkipLN, err = rewriteSkipLayerNorm(m)
		if err = st.keep("skipln", err, errNoSkipLayerNorm); err != nil {
			return st, err
		}
	}
	// After the mask step, whose shared bias it reads.
	if steps.MHA {
		st.MHA, err = rewriteMHA(m, steps.Heads)
		if err = st.keep("mha", err, errNoAttentionCore, errNoHeads); err != nil {
			return st, err
		}
	}
	return st, nil
}

// keep records a step's err in s.Kept when it is one of nothing (the step
// found nothing to rewrite: the graph runs on without it) and returns any
// other error, named after the step.
func (s *Stats) keep(step string, err error, nothing ...error) error {
	for _, n := range nothing {
		if errors.Is(err, n) {
			s.Kept = append(s.Kept, err)
			return nil
		}
	}
	if err != nil {
		return fmt.Errorf("%s: %w", step, err)
	}
	return nil
}

// RelAttentionNodes names the nodes of m's graph that the
// relative-attention rewrite replaces or leaves unused, and the prefix of
// the nodes it adds, rewriting m's graph in place (model.RelAttentionNodes
// says what for). It is ErrNoRelAttention for a graph the rewrite does not
// recognise.
func RelAttentionNodes(m *onnxpb.ModelProto) (removed []string, addedPrefix string, err error) {
	g := m.GetGraph()
	before := slices.Clone(g.GetNode())
	addedPrefix = uniquePrefix(NewIndex(g), relAttnPrefix)
	if _, err := rewriteRelAttention(g, defaultOpset(m), relAttnOptions{}); err != nil {
		return nil, "", err
	}
	kept := map[*onnxpb.NodeProto]bool{}
	for _, n := range g.GetNode() {
		kept[n] = true
	}
	for _, n := range before {
		if !kept[n] {
			removed = append(removed, n.GetName())
		}
	}
	return removed, addedPrefix, nil
}
