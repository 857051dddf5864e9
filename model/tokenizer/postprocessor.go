package tokenizer

import (
	"encoding/json"
	"fmt"
)

// templatePiece is one element of a template: either special token ids or
// the A (seq 0) / B (seq 1) sequence, each with its type id.
type templatePiece struct {
	special []int32
	seq     int // 0 = A, 1 = B, -1 = special
	typeID  int32
}

// template is one of the post-processor's layouts: the pair template
// ([CLS] A [SEP] B [SEP]) or the single-sequence one ([CLS] A [SEP]). No
// post_processor adds nothing and gives every token type id 0 for A, 1 for
// B, as HF's default encoding does.
type template []templatePiece

// templates is a post-processor's two layouts.
type templates struct {
	pair, single template
}

// apply lays sequences a (A) and b (B) out by the template, with each
// piece's type id.
func (t template) apply(a, b []int32) Pair {
	n := t.overhead() + len(a) + len(b)
	p := Pair{IDs: make([]int32, 0, n), TypeIDs: make([]int32, 0, n)}
	for _, piece := range t {
		ids := piece.special
		switch piece.seq {
		case 0:
			ids = a
		case 1:
			ids = b
		}
		p.IDs = append(p.IDs, ids...)
		for range ids {
			p.TypeIDs = append(p.TypeIDs, piece.typeID)
		}
	}
	return p
}

func (t template) overhead() int {
	n := 0
	for _, p := range t {
		n += len(p.special)
	}
	return n
}

func defaultTemplates() templates {
	return templates{pair: template{{seq: 0, typeID: 0}, {seq: 1, typeID: 1}}, single: template{{seq: 0}}}
}

// templatePieceConfig is one element of TemplateProcessing's "single" or
// "pair" list.
type templatePieceConfig struct {
	SpecialToken *struct {
		ID     string `json:"id"`
		TypeID int32  `json:"type_id"`
	} `json:"SpecialToken"`
	Sequence *struct {
		ID     string `json:"id"`
		TypeID int32  `json:"type_id"`
	} `json:"Sequence"`
}

// parseTemplate turns one TemplateProcessing list into a template. which
// is "pair" or "single"; a single template may only name sequence A.
func parseTemplate(which string, pieces []templatePieceConfig, specials map[string]struct {
	IDs []int32 `json:"ids"`
}) (template, error) {
	out := make(template, 0, len(pieces))
	for i, p := range pieces {
		switch {
		case p.SpecialToken != nil:
			st, ok := specials[p.SpecialToken.ID]
			if !ok {
				return nil, fmt.Errorf("tokenizer: TemplateProcessing %s piece %d names special token %q missing from special_tokens", which, i, p.SpecialToken.ID)
			}
			out = append(out, templatePiece{special: st.IDs, seq: -1, typeID: p.SpecialToken.TypeID})
		case p.Sequence != nil:
			seq := 0
			switch p.Sequence.ID {
			case "A":
			case "B":
				seq = 1
			}
			if (p.Sequence.ID != "A" && p.Sequence.ID != "B") || (which == "single" && seq != 0) {
				want := "A or B"
				if which == "single" {
					want = "A"
				}
				return nil, fmt.Errorf("tokenizer: TemplateProcessing %s piece %d has sequence %q, want %s", which, i, p.Sequence.ID, want)
			}
			out = append(out, templatePiece{seq: seq, typeID: p.Sequence.TypeID})
		default:
			return nil, fmt.Errorf("tokenizer: TemplateProcessing %s piece %d is neither SpecialToken nor Sequence", which, i)
		}
	}
	return out, nil
}

func parsePostProcessor(raw json.RawMessage) (templates, error) {
	if isNull(raw) {
		return defaultTemplates(), nil
	}
	var t typed
	if err := json.Unmarshal(raw, &t); err != nil {
		return templates{}, fmt.Errorf("tokenizer: bad post_processor: %w", err)
	}
	switch t.Type {
	case "ByteLevel":
		// It only trims offsets; ids and type ids are the default's.
		return defaultTemplates(), nil
	case "Sequence":
		// Recent byte-level exports chain ByteLevel (offsets) with the
		// template; at most one member may add tokens.
		var c struct {
			Processors []json.RawMessage `json:"processors"`
		}
		if err := json.Unmarshal(raw, &c); err != nil {
			return templates{}, fmt.Errorf("tokenizer: bad Sequence post_processor: %w", err)
		}
		out, found := defaultTemplates(), ""
		for i, sub := range c.Processors {
			var st typed
			if err := json.Unmarshal(sub, &st); err != nil {
				return templates{}, fmt.Errorf("tokenizer: bad post_processor %d of Sequence: %w", i, err)
			}
			tm, err := parsePostProcessor(sub)
			if err != nil {
				return templates{}, fmt.Errorf("tokenizer: post_processor %d of Sequence: %w", i, err)
			}
			if st.Type == "ByteLevel" {
				continue
			}
			if found != "" {
				return templates{}, fmt.Errorf("tokenizer: unsupported post_processor Sequence of %s and %s (only ByteLevel may join one other)", found, st.Type)
			}
			out, found = tm, st.Type
		}
		return out, nil
	case "TemplateProcessing":
		var c struct {
			Single        []templatePieceConfig `json:"single"`
			Pair          []templatePieceConfig `json:"pair"`
			SpecialTokens map[string]struct {
				IDs []int32 `json:"ids"`
			} `json:"special_tokens"`
		}
		if err := json.Unmarshal(raw, &c); err != nil {
			return templates{}, fmt.Errorf("tokenizer: bad TemplateProcessing: %w", err)
		}
		pair, err := parseTemplate("pair", c.Pair, c.SpecialTokens)
		if err != nil {
			return templates{}, err
		}
		single, err := parseTemplate("single", c.Single, c.SpecialTokens)
		if err != nil {
			return templates{}, err
		}
		return templates{pair: pair, single: single}, nil
	case "BertProcessing", "RobertaProcessing":
		var c struct {
			Sep [2]json.RawMessage `json:"sep"`
			Cls [2]json.RawMessage `json:"cls"`
		}
		if err := json.Unmarshal(raw, &c); err != nil {
			return templates{}, fmt.Errorf("tokenizer: bad %s: %w", t.Type, err)
		}
		var sep, cls int32
		if err := json.Unmarshal(c.Sep[1], &sep); err != nil {
			return templates{}, fmt.Errorf("tokenizer: %s sep id: %w", t.Type, err)
		}
		if err := json.Unmarshal(c.Cls[1], &cls); err != nil {
			return templates{}, fmt.Errorf("tokenizer: %s cls id: %w", t.Type, err)
		}
		single := template{{special: []int32{cls}, seq: -1}, {seq: 0}, {special: []int32{sep}, seq: -1}}
		if t.Type == "BertProcessing" {
			return templates{single: single, pair: template{
				{special: []int32{cls}, seq: -1}, {seq: 0}, {special: []int32{sep}, seq: -1},
				{seq: 1, typeID: 1}, {special: []int32{sep}, seq: -1, typeID: 1},
			}}, nil
		}
		// RoBERTa has no segment embeddings: every type id is 0.
		return templates{single: single, pair: template{
			{special: []int32{cls}, seq: -1}, {seq: 0}, {special: []int32{sep, sep}, seq: -1},
			{seq: 1}, {special: []int32{sep}, seq: -1},
		}}, nil
	}
	return templates{}, fmt.Errorf("tokenizer: unsupported post_processor type %q (supported: TemplateProcessing, RobertaProcessing, BertProcessing, ByteLevel, Sequence)", t.Type)
}
