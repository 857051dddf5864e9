// Package broker is `scorer broker` and the in-memory Kafka-protocol broker
// (franz-go's kfake) behind it: real wire protocol, consumer groups and
// offsets, nothing durable unless asked. `scorer run` starts the same broker
// in its own process for KAFKA_BROKERS=embedded, and tests start it
// in-process. A development tool: the Helm chart refuses it.
package broker
