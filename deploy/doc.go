// Package deploy holds the deployment files (Docker images, the compose stack, the Helm chart and the
// Grafana dashboard) and, in its tests, the checks that keep them consistent with docs/design.md and
// with the schema package: documented environment variables and metric names, the row key the JDBC
// sink upserts on, pinned base images, a non-root user, and the rendered chart's hardening, probes,
// shutdown grace and KEDA bounds. It has no non-test code.
package deploy
