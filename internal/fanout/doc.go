// Package fanout is the transcript fan-out: it asks the zero-shot question
// (a LabelConfig: one hypothesis per label, a threshold) of every sentence
// of a batch of transcripts. TranscriptScorer tokenizes each sentence once,
// builds its sentence × hypothesis pairs as the model encodes them, answers
// what it can from the score cache (the keys are hashed here) and hands the
// rest, the whole batch at once, to a PairScorer: the device pool
// (gpupool) in every command, a model.Session in tests. It then lays the
// scores back out as records.
//
// It sits above gpupool in the call chain (consumer → fan-out → gpupool →
// model) and imports model (the tokenizer, Pair, the model's identity) and
// schema, never gpupool: the engine is an interface, so the pool knows
// nothing of transcripts or labels and the fan-out nothing of devices.
package fanout
