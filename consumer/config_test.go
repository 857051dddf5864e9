package consumer

import (
	"strings"
	"testing"
	"time"
)

func TestConfigDefaultsAndValidate(t *testing.T) {
	t.Parallel()
	cfg := Config{Brokers: []string{"x:9092"}}.WithDefaults()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	if cfg.Topic != "transcripts" || cfg.BatchMaxMessages != 16 || cfg.BatchMaxBytes != 8<<20 ||
		cfg.BatchMaxWait != 200*time.Millisecond || cfg.MaxInflightBatches != 2 || cfg.MaxMessageBytes != 8<<20 {
		t.Fatalf("defaults = %+v", cfg)
	}
	bad := cfg
	bad.RevokeTimeout = bad.RebalanceTimeout
	if err := bad.Validate(); err == nil || !strings.HasPrefix(err.Error(), "consumer:") {
		t.Fatalf("RevokeTimeout >= RebalanceTimeout: err = %v", err)
	}
	if err := (Config{}).WithDefaults().Validate(); err == nil {
		t.Fatal("no brokers: want error")
	}
}

// TestRebalanceEndFitsTimeouts: the end of a generation at a rebalance (the
// heartbeat that brings the news, the probe commit, the drain, the final
// commit) fits in both the rebalance timeout and the session timeout, for
// the defaults and for timings at the edges of what Validate accepts.
func TestRebalanceEndFitsTimeouts(t *testing.T) {
	t.Parallel()
	for _, cfg := range []Config{
		{},
		{SessionTimeout: 6 * time.Second, RebalanceTimeout: 10 * time.Second},
		{SessionTimeout: 45 * time.Second, RebalanceTimeout: 5 * time.Second},
		{SessionTimeout: 10 * time.Second, RebalanceTimeout: 60 * time.Second, RevokeTimeout: 4 * time.Second},
		{RebalanceTimeout: 30 * time.Second, HeartbeatInterval: 5 * time.Second, RevokeTimeout: 24 * time.Second},
	} {
		cfg.Brokers = []string{"x:9092"}
		cfg = cfg.WithDefaults()
		if err := cfg.Validate(); err != nil {
			t.Fatalf("%+v: %v", cfg, err)
		}
		budget := cfg.rebalanceCommitBudget()
		end := cfg.HeartbeatInterval + budget + cfg.RevokeTimeout + budget
		if budget <= 0 || end >= cfg.RebalanceTimeout || end >= cfg.SessionTimeout {
			t.Errorf("session %v rebalance %v heartbeat %v revoke %v: commit budget %v, end %v",
				cfg.SessionTimeout, cfg.RebalanceTimeout, cfg.HeartbeatInterval, cfg.RevokeTimeout, budget, end)
		}
	}
}
