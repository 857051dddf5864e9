package deploy

import (
	"os"
	"regexp"
	"testing"
)

// TestHelmKafkaDefaults: the chart's ConfigMap, rendered with values.yaml
// as it is, sets KAFKA_TOPIC_REPLICATION_FACTOR to the binary's own default
// (-1: the cluster's default.replication.factor), not a fixed 1 a cluster
// with min.insync.replicas=2 refuses acks=all writes to; and leaves
// KAFKA_START_OFFSET to the binary unless config sets it.
func TestHelmKafkaDefaults(t *testing.T) {
	helm := helmBin(t)
	src, err := os.ReadFile(cmdConfig)
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`env:"KAFKA_TOPIC_REPLICATION_FACTOR" envDefault:"([^"]*)"`).FindSubmatch(src)
	if m == nil {
		t.Fatal("no envDefault for KAFKA_TOPIC_REPLICATION_FACTOR in " + cmdConfig)
	}
	if string(m[1]) != "-1" {
		t.Errorf("the binary's KAFKA_TOPIC_REPLICATION_FACTOR defaults to %s, want -1", m[1])
	}
	cm := configMapData(renderChart(t, helm, nil, nil))
	if got := cm["KAFKA_TOPIC_REPLICATION_FACTOR"]; got != string(m[1]) {
		t.Errorf("chart renders KAFKA_TOPIC_REPLICATION_FACTOR=%v, want the binary's default %s", got, m[1])
	}
	if got, ok := cm["KAFKA_START_OFFSET"]; ok {
		t.Errorf("chart renders KAFKA_START_OFFSET=%v by default, want it left to the binary", got)
	}
	cm = configMapData(renderChart(t, helm, []string{"config.KAFKA_START_OFFSET=latest"}, nil))
	if got := cm["KAFKA_START_OFFSET"]; got != "latest" {
		t.Errorf("config.KAFKA_START_OFFSET=latest renders %v", got)
	}
}
