package streaming

import (
	"flag"
	"io"
	"testing"

	"github.com/rs/zerolog"

	"github.com/scorer/scorer/internal/config"
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
