// Package model is the NLI model: Load reads a model folder (config.json's
// labels, tokenizer.json through package tokenizer, the ONNX graph's inputs
// and output type) into a Model, which encodes (sentence, hypothesis) pairs
// as the model was trained (PairEncoding) and turns logits into a score
// (ScoreMode: P(entailment) by softmax, or entailment against
// contradiction). A Session runs the graph on ONNX Runtime (ortenv.InitRuntime
// starts the process's one environment) on the CPU or a CUDA device, and
// is safe for concurrent ScorePairs calls. Whole transcripts become pairs
// above the device pool, in internal/fanout.
//
// The package knows nothing of Kafka, of transcripts or labels, or of
// devices beyond the one a Session was opened on; it depends only on
// schema for the wire types.
package model
