package model

import (
	"crypto/sha256"
	"encoding"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
)

// modelConfig is the part of config.json Load needs.
type modelConfig struct {
	labels       []string
	maxPositions int    // 0 when absent
	heads        int    // num_attention_heads, 0 when absent
	eosHead      int32  // eosHeadID: the eos id a BART-style head reads, else -1
	nameOrPath   string // _name_or_path: what save_pretrained was loaded from
	// raw is the file's bytes as parsed: the version covers them
	// (versionPrefix).
	raw []byte
}

func readConfig(path string) (modelConfig, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return modelConfig{}, fmt.Errorf("model: reading config: %w", err)
	}
	var raw struct {
		ID2Label              map[string]string `json:"id2label"`
		MaxPositionEmbeddings int               `json:"max_position_embeddings"`
		NumAttentionHeads     int               `json:"num_attention_heads"`
		Architectures         []string          `json:"architectures"`
		EOSTokenID            *int              `json:"eos_token_id"`
		NameOrPath            string            `json:"_name_or_path"`
	}
	if err := json.Unmarshal(data, &raw); err != nil {
		return modelConfig{}, fmt.Errorf("model: parsing %s: %w", path, err)
	}
	labels, err := labelsFromID2Label(raw.ID2Label)
	if err != nil {
		return modelConfig{}, fmt.Errorf("model: %s: %w", path, err)
	}
	eos, err := eosHeadID(raw.Architectures, raw.EOSTokenID)
	if err != nil {
		return modelConfig{}, fmt.Errorf("model: %s: %w", path, err)
	}
	return modelConfig{labels: labels, maxPositions: raw.MaxPositionEmbeddings, heads: raw.NumAttentionHeads, eosHead: eos, nameOrPath: raw.NameOrPath, raw: data}, nil
}

// labelsFromID2Label turns config.json's string-keyed id2label into a slice,
// insisting on ids 0..n-1 so an index is always a valid logits column.
func labelsFromID2Label(m map[string]string) ([]string, error) {
	if len(m) < 2 {
		return nil, fmt.Errorf("id2label has %d entries, an NLI classifier needs at least 2", len(m))
	}
	labels := make([]string, len(m))
	seen := make([]bool, len(m))
	for k, v := range m {
		i, err := strconv.Atoi(k)
		if err != nil || i < 0 || i >= len(m) {
			return nil, fmt.Errorf("id2label key %q is not an index in 0..%d", k, len(m)-1)
		}
		if seen[i] {
			return nil, fmt.Errorf("id2label index %d appears twice", i)
		}
		seen[i], labels[i] = true, v
	}
	return labels, nil
}

// labelIndex finds the first label starting with prefix, case-insensitively.
// A prefix rather than equality matches "ENTAILMENT", "entailed" and the like.
func labelIndex(labels []string, prefix string) int {
	return slices.IndexFunc(labels, func(l string) bool {
		return strings.HasPrefix(strings.ToLower(l), prefix)
	})
}

func (m *Model) pickIndices(opts LoadOptions, mode ScoreMode) error {
	n := len(m.ID2Label)
	if opts.EntailmentIndex != nil {
		if i := *opts.EntailmentIndex; i < 0 || i >= n {
			return fmt.Errorf("model: entailment index %d out of range for %d labels %v", i, n, m.ID2Label)
		}
		m.EntailmentIndex = *opts.EntailmentIndex
	} else if m.EntailmentIndex = labelIndex(m.ID2Label, "entail"); m.EntailmentIndex < 0 {
		return fmt.Errorf("model: no entailment label in id2label %v; set the entailment index explicitly (ENTAILMENT_INDEX)", m.ID2Label)
	}

	m.ContradictionIndex = -1
	if opts.ContradictionIndex != nil {
		if i := *opts.ContradictionIndex; i < 0 || i >= n {
			return fmt.Errorf("model: contradiction index %d out of range for %d labels %v", i, n, m.ID2Label)
		}
		m.ContradictionIndex = *opts.ContradictionIndex
	} else if m.ContradictionIndex = labelIndex(m.ID2Label, "contradict"); m.ContradictionIndex < 0 {
		m.ContradictionIndex = labelIndex(m.ID2Label, "not_entail")
	}
	if mode == ScoreEntailVsContradiction {
		if m.ContradictionIndex < 0 {
			return fmt.Errorf("model: score mode %s needs a contradiction or not_entailment label, none in id2label %v; set the contradiction index explicitly (CONTRADICTION_INDEX)", mode, m.ID2Label)
		}
		if m.ContradictionIndex == m.EntailmentIndex {
			return fmt.Errorf("model: contradiction and entailment index are both %d", m.EntailmentIndex)
		}
	}
	return nil
}

// readModelMaxLength returns tokenizer_config.json's model_max_length, or 0
// when the file or field is absent, and the file's bytes as parsed (nil
// when it is absent: the version covers them, versionPrefix). HF writes a
// huge sentinel (1e30) for "unlimited", hence the float.
func readModelMaxLength(path string) (int, []byte, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil, nil
	} else if err != nil {
		return 0, nil, fmt.Errorf("model: reading tokenizer config: %w", err)
	}
	var raw struct {
		ModelMaxLength *float64 `json:"model_max_length"`
	}
	if err := json.Unmarshal(data, &raw); err != nil {
		return 0, nil, fmt.Errorf("model: parsing %s: %w", path, err)
	}
	if raw.ModelMaxLength == nil || *raw.ModelMaxLength <= 0 || *raw.ModelMaxLength > 1<<20 {
		return 0, data, nil
	}
	return int(*raw.ModelMaxLength), data, nil
}

// versionPrefix is the state of the version's SHA-256 (hashModel) after
// the files Load read whole besides the graph, in this order:
// config.json, tokenizer.json and tokenizer_config.json when present. The
// graph's files follow; `cat` of them all in that order piped to
// sha256sum gives the version.
//
// Why these files: each decides scores under the same graph (a tokenizer
// fix gives other ids, id2label another class read as entailment,
// model_max_length another truncation), and what is keyed on the version
// (results' model_sha256, the score cache, the memory calibrations, the
// graph cache) must tell the two apart. Why first, as their bytes were
// parsed: checkFiles hashes the graph's files again from this state, and
// a tokenizer.json changed on disk since Load read it changes nothing a
// session runs. Why a saved state: the bytes (8.6 MB of DeBERTa's
// tokenizer) need not be kept.
func versionPrefix(files ...[]byte) ([]byte, error) {
	h := sha256.New()
	for _, b := range files {
		h.Write(b)
	}
	return h.(encoding.BinaryMarshaler).MarshalBinary()
}

// pickMaxLength applies LoadOptions.MaxLength's rule. An explicit length
// beyond the position table is rejected: the graph would index past its
// position embeddings at Run.
func pickMaxLength(requested, tokMax, maxPositions int) (int, error) {
	switch {
	case requested < 0:
		return 0, fmt.Errorf("model: max length %d is negative", requested)
	case requested > 0:
		if maxPositions > 0 && requested > maxPositions {
			return 0, fmt.Errorf("model: max length %d exceeds max_position_embeddings %d", requested, maxPositions)
		}
		return requested, nil
	}
	n := defaultMaxLen
	for _, v := range []int{tokMax, maxPositions} {
		if v > 0 && v < n {
			n = v
		}
	}
	return n, nil
}

// hubID reports whether s has the shape of a Hugging Face Hub model id,
// owner/name, rather than a local folder the model was saved from (absolute,
// ./ or ../, ~, or deeper): only an id names the model to its users.
func hubID(s string) bool {
	owner, name, ok := strings.Cut(s, "/")
	return ok && hubIDPart(owner) && hubIDPart(name) && owner != "." && owner != ".." && owner != "~"
}

func hubIDPart(s string) bool {
	if s == "" || len(s) > 96 || s[0] == '.' || s[0] == '-' {
		return false
	}
	for _, r := range s {
		if !(r == '-' || r == '_' || r == '.' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z') {
			return false
		}
	}
	return true
}
