package config

import (
	"strings"
	"testing"

	"github.com/scorer/scorer/model/scorecache"
)

// TestPerfSettings covers the settings this issue added: the score cache's
// size and the CPU batch shapes, their checks and how a pool's shape is
// chosen.
func TestPerfSettings(t *testing.T) {
	cfg, err := parseConfig(t, nil)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.ScoreCacheBytes != 256<<20 || cfg.CPUMaxBatchRows <= 0 || cfg.CPUMaxBatchRows >= cfg.MaxBatchRows {
		t.Errorf("defaults: cache %d, CPU rows %d, rows %d", cfg.ScoreCacheBytes, cfg.CPUMaxBatchRows, cfg.MaxBatchRows)
	}
	for env, want := range map[string]string{
		"SCORE_CACHE_BYTES=-1":    "SCORE_CACHE_BYTES",
		"SCORE_CACHE_BYTES=100":   "SCORE_CACHE_BYTES",
		"CPU_MAX_BATCH_ROWS=0":    "CPU_MAX_BATCH_ROWS",
		"CPU_MAX_BATCH_TOKENS=-5": "CPU_MAX_BATCH_TOKENS",
	} {
		k, v, _ := strings.Cut(env, "=")
		if _, err := parseConfig(t, map[string]string{k: v}); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v", env, err)
		}
	}
	for _, v := range []string{"0", "3072", "1048576"} {
		if _, err := parseConfig(t, map[string]string{"SCORE_CACHE_BYTES": v}); err != nil {
			t.Errorf("SCORE_CACHE_BYTES=%s: %v", v, err)
		}
	}
	if scorecache.MinBytes != 3072 {
		t.Errorf("scorecache.MinBytes = %d; the README and this test say 3072", scorecache.MinBytes)
	}

	c := Config{MaxBatchTokens: 16384, MaxBatchRows: 256, CPUMaxBatchTokens: 8192, CPUMaxBatchRows: 16}
	if tok, rows := BatchShape(c, false); tok != 16384 || rows != 256 {
		t.Errorf("GPU shape %d/%d, want MAX_BATCH_* as set", tok, rows)
	}
	if tok, rows := BatchShape(c, true); tok != 8192 || rows != 16 {
		t.Errorf("CPU shape %d/%d, want the CPU caps", tok, rows)
	}
	c.MaxBatchRows, c.MaxBatchTokens = 8, 2048 // an explicit smaller MAX_BATCH_* still counts on CPU
	if tok, rows := BatchShape(c, true); tok != 2048 || rows != 8 {
		t.Errorf("CPU shape with smaller MAX_BATCH_*: %d/%d", tok, rows)
	}
}
