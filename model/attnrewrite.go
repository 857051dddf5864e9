package model

import (
	"errors"
	"fmt"
	"strings"

	"github.com/scorer/scorer/model/onnxpb"
)

// The attention rewrites run at load beside the relative-attention one
// (relattn.go), on the graphs it recognises, each by name so that a
// setting (ATTENTION_REWRITES) can leave any of them out and `scorer
// compare` can A/B one: the same logits within 1e-5 in float32 either way
// (relattn_test.go, attnrewrite_test.go).
const (
	// RewriteAlign widens each window of relative positions to a
	// multiple of 8 (relAttnOptions.align).
	RewriteAlign = "align"
	// RewriteScale moves the score terms' Div onto the windows
	// (relAttnOptions.scale).
	RewriteScale = "scale"
	// RewriteMask replaces each layer's Where → Softmax → Where by one
	// additive key mask for all layers (attnmask.go).
	RewriteMask = "mask"
	// RewriteSkipLayerNorm fuses each residual Add (and the dense
	// product's bias) with its LayerNorm (skipln.go).
	RewriteSkipLayerNorm = "skipln"
	// RewriteMHA runs each layer's attention core as ONNX Runtime's
	// MultiHeadAttention (attnmha.go); it needs mask and is not on by
	// default until a GPU says it pays.
	RewriteMHA = "mha"
)

// DefaultAttentionRewrites is every attention rewrite that is on unless a
// setting says otherwise.
const DefaultAttentionRewrites = RewriteAlign + "," + RewriteScale + "," + RewriteMask + "," + RewriteSkipLayerNorm

// AttentionRewriteNames is every rewrite ParseAttentionRewrites knows.
var AttentionRewriteNames = []string{RewriteAlign, RewriteScale, RewriteMask, RewriteSkipLayerNorm, RewriteMHA}

// alignPositions is the multiple RewriteAlign widens windows to: fp16
// tensor-core GEMMs want every dimension a multiple of 8.
const alignPositions = 8

// attnSteps is a parsed ATTENTION_REWRITES.
type attnSteps struct {
	align, scale, mask, skipLN, mha bool
	// heads is config.json's num_attention_heads (0: not stated), which
	// mha needs.
	heads int
}

// ParseAttentionRewrites checks a comma-separated list of rewrite names
// (AttentionRewriteNames; "none" for none, "" for the defaults) and returns
// it in a canonical order.
func ParseAttentionRewrites(s string) (string, error) {
	st, err := parseAttnSteps(s)
	if err != nil {
		return "", err
	}
	return st.String(), nil
}

func parseAttnSteps(s string) (attnSteps, error) {
	if strings.TrimSpace(s) == "" {
		s = DefaultAttentionRewrites
	}
	var st attnSteps
	for f := range strings.SplitSeq(s, ",") {
		switch strings.TrimSpace(f) {
		case RewriteAlign:
			st.align = true
		case RewriteScale:
			st.scale = true
		case RewriteMask:
			st.mask = true
		case RewriteSkipLayerNorm:
			st.skipLN = true
		case RewriteMHA:
			st.mha = true
		case "none":
		default:
			return st, fmt.Errorf("unknown attention rewrite %q (known: %s, or none)", f, strings.Join(AttentionRewriteNames, ", "))
		}
	}
	if st.mha && !st.mask {
		return st, fmt.Errorf("attention rewrite %s needs %s", RewriteMHA, RewriteMask)
	}
	return st, nil
}

func (st attnSteps) String() string {
	var on []string
	for _, s := range []struct {
		on   bool
		name string
	}{{st.align, RewriteAlign}, {st.scale, RewriteScale}, {st.mask, RewriteMask}, {st.skipLN, RewriteSkipLayerNorm}, {st.mha, RewriteMHA}} {
		if s.on {
			on = append(on, s.name)
		}
	}
	if len(on) == 0 {
		return "none"
	}
	return strings.Join(on, ",")
}

// attnStats is what rewriteAttention did.
type attnStats struct {
	rel relAttnStats
	// mask and skipLN are those steps' counts, kept why a step asked
	// for changed nothing.
	mask   maskStats
	skipLN skipLNStats
	mha    mhaStats
	kept   []error
}

func (s attnStats) String() string {
	done := []string{"relative attention rewritten: " + s.rel.String()}
	if s.mask.Softmaxes > 0 {
		done = append(done, s.mask.String())
	}
	if s.skipLN.Fused > 0 {
		done = append(done, s.skipLN.String())
	}
	if s.mha.Fused > 0 {
		done = append(done, s.mha.String())
	}
	for _, err := range s.kept {
		done = append(done, "kept: "+err.Error())
	}
	return strings.Join(done, "; ")
}

// rewriteAttention runs the relative-attention rewrite and then the steps
// asked for, on g in place. A graph the relative-attention rewrite does
// not recognise comes back untouched with its error; the other steps then
// do not run (they are DeBERTa's).
func rewriteAttention(m *onnxpb.ModelProto, steps attnSteps) (attnStats, error) {
	var st attnStats
	g, opset := m.GetGraph(), defaultOpset(m)
	opts := relAttnOptions{scale: steps.scale}
	if steps.align {
		opts.align = alignPositions
	}
	var err error
	if st.rel, err = rewriteRelAttention(g, opset, opts); err != nil {
		return st, err
	}
	if steps.mask {
		st.mask, err = rewriteMask(g, opset)
		switch {
		case errors.Is(err, errNoMaskedSoftmax):
			st.kept = append(st.kept, err)
		case err != nil:
			return st, fmt.Errorf("mask: %w", err)
		}
	}
	if steps.skipLN {
		st.skipLN, err = rewriteSkipLayerNorm(m)
		switch {
		case errors.Is(err, errNoSkipLayerNorm):
			st.kept = append(st.kept, err)
		case err != nil:
			return st, fmt.Errorf("skipln: %w", err)
		}
	}
	// After the mask step, whose shared bias it reads.
	if steps.mha {
		st.mha, err = rewriteMHA(m, steps.heads)
		switch {
		case errors.Is(err, errNoAttentionCore) || st.mha.Heads < 1:
			st.kept = append(st.kept, err)
		case err != nil:
			return st, fmt.Errorf("mha: %w", err)
		}
	}
	return st, nil
}
