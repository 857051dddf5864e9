package streaming

import (
	"context"
	"flag"
	"io"
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kversion"

	"github.com/scorer/scorer/internal/config"
	"github.com/scorer/scorer/internal/kafkatest"
	"github.com/scorer/scorer/producer"
)

func parseConfig(t *testing.T, environ map[string]string, args ...string) (config.Config, error) {
	t.Helper()
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	return config.Load(config.Run, func(k string) string { return environ[k] }, fs, args)
}

// TestTopicPlanFitsKafkaDefault: the limits docs/operating.md suggests for
// a cluster that keeps Kafka's default max.message.bytes pass the start-up
// check; the defaults do not, and say what would.
func TestTopicPlanFitsKafkaDefault(t *testing.T) {
	const kafkaDefault = 1048588
	for _, tc := range []struct {
		env  map[string]string
		fits bool
	}{
		{map[string]string{"MAX_MESSAGE_BYTES": "65536", "MAX_SENTENCES": "2000"}, true},
		{nil, false},
	} {
		cfg, err := parseConfig(t, tc.env)
		if err != nil {
			t.Fatal(err)
		}
		pc := producer.Config{Brokers: []string{"b"}, Topic: cfg.OutputTopic, DLQTopic: cfg.DLQTopic, Format: cfg.OutputFormat}
		plan, err := planTopics(cfg, pc, 1)
		if err != nil {
			t.Fatal(err)
		}
		limits := map[string]int64{cfg.OutputTopic: kafkaDefault, cfg.DLQTopic: kafkaDefault}
		err = checkTopicLimits(cfg, pc, plan, limits, zerolog.Nop())
		if (err == nil) != tc.fits {
			t.Errorf("%v on 1 MiB topics: %v, want fits=%v", tc.env, err, tc.fits)
		}
	}
}

// TestPrepareTopicsReplicationDefault: `scorer run`'s topics, created with
// the default KAFKA_TOPIC_REPLICATION_FACTOR, take the cluster's default
// replication (kfake: min(3, brokers)), not one replica; a cluster older
// than Kafka 2.4 stops start-up with an error naming the setting; 0 is
// refused.
func TestPrepareTopicsReplicationDefault(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	for name, tc := range map[string]struct {
		opts    []kfake.Opt
		env     map[string]string
		replica int    // replicas of every partition; 0: refused
		err     string // in the error when refused
	}{
		"default":         {opts: []kfake.Opt{kfake.NumBrokers(3)}, replica: 3},
		"explicit":        {opts: []kfake.Opt{kfake.NumBrokers(3)}, env: map[string]string{"KAFKA_TOPIC_REPLICATION_FACTOR": "2"}, replica: 2},
		"default on 2.3":  {opts: []kfake.Opt{kfake.NumBrokers(3), kfake.MaxVersions(kversion.V2_3_0())}, err: "set KAFKA_TOPIC_REPLICATION_FACTOR"},
		"explicit on 2.3": {opts: []kfake.Opt{kfake.NumBrokers(3), kfake.MaxVersions(kversion.V2_3_0())}, env: map[string]string{"KAFKA_TOPIC_REPLICATION_FACTOR": "3"}, replica: 3},
	} {
		t.Run(name, func(t *testing.T) {
			c, err := kfake.NewCluster(tc.opts...)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			env := map[string]string{"KAFKA_BROKERS": strings.Join(c.ListenAddrs(), ","), "KAFKA_INPUT_PARTITIONS": "2"}
			maps.Copy(env, tc.env)
			cfg, err := parseConfig(t, env)
			if err != nil {
				t.Fatal(err)
			}
			_, err = Prepare(ctx, cfg, false, zerolog.Nop())
			if tc.replica == 0 {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err = %v, want one saying %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			for _, topic := range []string{cfg.InputTopic, cfg.OutputTopic, cfg.DLQTopic} {
				got := kafkatest.Replicas(t, c.ListenAddrs(), topic)
				if len(got) == 0 {
					t.Fatalf("%s: not in the cluster's metadata", topic)
				}
				for p, n := range got {
					if n != tc.replica {
						t.Errorf("%s partition %d: %d replicas, want %d", topic, p, n, tc.replica)
					}
				}
			}
		})
	}
	if _, err := parseConfig(t, map[string]string{"KAFKA_TOPIC_REPLICATION_FACTOR": "0"}); err == nil || !strings.Contains(err.Error(), "KAFKA_TOPIC_REPLICATION_FACTOR") {
		t.Errorf("KAFKA_TOPIC_REPLICATION_FACTOR=0: err = %v, want it refused", err)
	}
}
