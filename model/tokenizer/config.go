package tokenizer

import "encoding/json"

// The structs below mirror the parts of tokenizer.json this package reads.
// Components are kept as raw JSON until their "type" is known, because each
// type has its own fields.

type fileConfig struct {
	AddedTokens   []addedTokenConfig `json:"added_tokens"`
	Normalizer    json.RawMessage    `json:"normalizer"`
	PreTokenizer  json.RawMessage    `json:"pre_tokenizer"`
	Model         json.RawMessage    `json:"model"`
	PostProcessor json.RawMessage    `json:"post_processor"`
	Padding       *struct {
		PadID    *int32 `json:"pad_id"`
		PadToken string `json:"pad_token"`
	} `json:"padding"`
}

type addedTokenConfig struct {
	ID         int32  `json:"id"`
	Content    string `json:"content"`
	SingleWord bool   `json:"single_word"`
	LStrip     bool   `json:"lstrip"`
	RStrip     bool   `json:"rstrip"`
	Normalized bool   `json:"normalized"`
	Special    bool   `json:"special"`
}

type typed struct {
	Type string `json:"type"`
}

// isNull reports whether a component is absent, which HF treats as "no step".
func isNull(raw json.RawMessage) bool {
	return len(raw) == 0 || string(raw) == "null"
}
