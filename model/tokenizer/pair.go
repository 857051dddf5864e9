package tokenizer

// Pair is one encoded (premise, hypothesis) input, template applied: special
// tokens included, truncated to the model's maximum length, not padded.
// TypeIDs has one entry per ID (segment ids from the post_processor template);
// sessions feed it only when the graph has a token_type_ids input.
type Pair struct {
	IDs     []int32
	TypeIDs []int32
}

// Len is the pair's token count, the unit of every batch budget.
func (p Pair) Len() int { return len(p.IDs) }
