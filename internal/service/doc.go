// Package service is `scorer run`'s wiring, top to bottom: configuration
// (config.go) → model and pool (stack.go) → Kafka consumer and producer
// (run.go, kafkaconn.go) → HTTP health and metrics (server.go, liveness.go).
// It also holds what the other subcommands share with the service: the
// process environment (cli.Env), usage errors, the logger, and the development
// helpers `scorer run` itself starts (the in-memory broker, the demo
// loader, `scorer produce`). The benchmark harness and the offline scorer
// import this package; it imports neither.
package service
