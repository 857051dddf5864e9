package tokenizer

// Parse builds a Tokenizer from the bytes of a tokenizer.json, as Load
// does from the file: for a caller that also hashes the bytes it parsed
// (the model's version covers its tokenizer), so that the version names
// exactly the tokenizer in use, whatever the file holds meanwhile.
func Parse(data []byte) (*Tokenizer, error) { return parse(data) }
