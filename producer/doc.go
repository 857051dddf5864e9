// Package producer publishes scorer's output to Kafka with segmentio/kafka-go:
// ScoredTranscripts (JSON or Kafka Connect JsonConverter envelopes) keyed by
// call_id, optional flat ScoreRows for JDBC sinks, and dead letters carrying
// Kafka Connect's __connect.errors.* headers.
//
// Every write is synchronous and acknowledged by all in-sync replicas
// (RequiredAcks=RequireAll, Async=false) because the consumer marks an input
// offset done, and later commits it, only once Publish or DeadLetter has
// returned nil. Delivery is at-least-once: a retried write may duplicate a
// record, which is why keys are deterministic (call_id, RowKey).
package producer
