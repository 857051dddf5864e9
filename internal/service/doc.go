// Package service is `scorer run`, the streaming scorer, and nothing else:
// Command starts one component per step in dependency order (steps.go:
// HTTP health and metrics, the in-memory broker when asked, the Kafka
// topics, the scoring stack, producer, consumer, the demo), each step
// registering its closer, then serves until the signal and closes them in
// reverse under SHUTDOWN_TIMEOUT (run.go). server.go and liveness.go are
// /readyz and /healthz. What the other subcommands share lives in
// internal/cli (the kit), internal/config (the settings), internal/scoring
// (the scoring stack), internal/streaming (topics, producer and consumer,
// which bench's pipeline starts too) and internal/broker and
// internal/produce (the development Kafka tools); no package imports this
// one but the binary's main.
package service
