package model

import "github.com/scorer/scorer/model/tokenizer"

// Pair is one encoded (premise, hypothesis) input; see tokenizer.Pair. The
// alias lets gpupool and consumers speak of model.Pair without importing the
// tokenizer.
type Pair = tokenizer.Pair
