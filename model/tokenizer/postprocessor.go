package tokenizer

import (
	"encoding/json"
	"fmt"
)

// templatePiece is one element of a pair template: either special token
// ids or the A (seq 0) / B (seq 1) sequence, each with its type id.
type templatePiece struct {
	special []int32
	seq     int // 0 = A, 1 = B, -1 = special
	typeID  int32
}

// template is the post-processor's pair layout. A nil template (no
// post_processor) adds nothing and gives every token type id 0 for A, 1
// for B, as HF's default pair encoding does.
type template []templatePiece

func (t template) overhead() int {
	n := 0
	for _, p := range t {
		n += len(p.special)
	}
	return n
}

func defaultTemplate() template {
	return template{{seq: 0, typeID: 0}, {seq: 1, typeID: 1}}
}

func parsePostProcessor(raw json.RawMessage) (template, error) {
	if isNull(raw) {
		return defaultTemplate(), nil
	}
	var t typed
	if err := json.Unmarshal(raw, &t); err != nil {
		return nil, fmt.Errorf("tokenizer: bad post_processor: %w", err)
	}
	switch t.Type {
	case "TemplateProcessing":
		var c struct {
			Pair []struct {
				SpecialToken *struct {
					ID     string `json:"id"`
					TypeID int32  `json:"type_id"`
				} `json:"SpecialToken"`
				Sequence *struct {
					ID     string `json:"id"`
					TypeID int32  `json:"type_id"`
				} `json:"Sequence"`
			} `json:"pair"`
			SpecialTokens map[string]struct {
				IDs []int32 `json:"ids"`
			} `json:"special_tokens"`
		}
		if err := json.Unmarshal(raw, &c); err != nil {
			return nil, fmt.Errorf("tokenizer: bad TemplateProcessing: %w", err)
		}
		out := make(template, 0, len(c.Pair))
		for i, p := range c.Pair {
			switch {
			case p.SpecialToken != nil:
				st, ok := c.SpecialTokens[p.SpecialToken.ID]
				if !ok {
					return nil, fmt.Errorf("tokenizer: TemplateProcessing pair piece %d names special token %q missing from special_tokens", i, p.SpecialToken.ID)
				}
				out = append(out, templatePiece{special: st.IDs, seq: -1, typeID: p.SpecialToken.TypeID})
			case p.Sequence != nil:
				seq := 0
				switch p.Sequence.ID {
				case "A":
				case "B":
					seq = 1
				default:
					return nil, fmt.Errorf("tokenizer: TemplateProcessing pair piece %d has sequence %q, want A or B", i, p.Sequence.ID)
				}
				out = append(out, templatePiece{seq: seq, typeID: p.Sequence.TypeID})
			default:
				return nil, fmt.Errorf("tokenizer: TemplateProcessing pair piece %d is neither SpecialToken nor Sequence", i)
			}
		}
		return out, nil
	case "BertProcessing", "RobertaProcessing":
		var c struct {
			Sep [2]json.RawMessage `json:"sep"`
			Cls [2]json.RawMessage `json:"cls"`
		}
		if err := json.Unmarshal(raw, &c); err != nil {
			return nil, fmt.Errorf("tokenizer: bad %s: %w", t.Type, err)
		}
		var sep, cls int32
		if err := json.Unmarshal(c.Sep[1], &sep); err != nil {
			return nil, fmt.Errorf("tokenizer: %s sep id: %w", t.Type, err)
		}
		if err := json.Unmarshal(c.Cls[1], &cls); err != nil {
			return nil, fmt.Errorf("tokenizer: %s cls id: %w", t.Type, err)
		}
		if t.Type == "BertProcessing" {
			return template{
				{special: []int32{cls}, seq: -1}, {seq: 0}, {special: []int32{sep}, seq: -1},
				{seq: 1, typeID: 1}, {special: []int32{sep}, seq: -1, typeID: 1},
			}, nil
		}
		// RoBERTa has no segment embeddings: every type id is 0.
		return template{
			{special: []int32{cls}, seq: -1}, {seq: 0}, {special: []int32{sep, sep}, seq: -1},
			{seq: 1}, {special: []int32{sep}, seq: -1},
		}, nil
	}
	return nil, fmt.Errorf("tokenizer: unsupported post_processor type %q", t.Type)
}
