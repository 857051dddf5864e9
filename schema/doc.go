// Package schema holds the wire shapes that flow through scorer: the input
// TranscriptEvent, the ScoredTranscript and ScoreRow outputs, the Kafka Connect
// JsonConverter envelope, and the dead-letter headers. It is pure data plus
// decoding and validation: no Kafka, ONNX Runtime or GPU types, no I/O.
package schema
