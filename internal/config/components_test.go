package config

import (
	"context"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/segmentio/kafka-go"

	"github.com/scorer/scorer/gpupool"
	"github.com/scorer/scorer/internal/fanout/scorecache"
	"github.com/scorer/scorer/model"
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

}

// oneEngine is the least gpupool.Engine: a score of 0 for every pair.
type oneEngine struct{}

func (oneEngine) ScorePairs(_ context.Context, pairs []model.Pair) ([]float32, error) {
	return make([]float32, len(pairs)), nil
}
func (oneEngine) Close() error { return nil }

// TestPoolOptionsBatchShape: the pool PoolOptions builds takes MAX_BATCH_*
// capped by CPU_MAX_BATCH_* on a CPU pool, the smaller value winning, so an
// explicit MAX_BATCH_ROWS=8 still counts there.
func TestPoolOptionsBatchShape(t *testing.T) {
	for _, tc := range []struct {
		env                  map[string]string
		wantTokens, wantRows int
	}{
		{map[string]string{"CPU_MAX_BATCH_TOKENS": "8192", "CPU_MAX_BATCH_ROWS": "16"}, 8192, 16},
		{map[string]string{"CPU_MAX_BATCH_TOKENS": "8192", "MAX_BATCH_ROWS": "8", "MAX_BATCH_TOKENS": "2048"}, 2048, 8},
	} {
		env := map[string]string{"DEVICE": "cpu", "CPU_MAX_BATCH_BYTES": "off"}
		maps.Copy(env, tc.env)
		cfg, err := parseConfig(t, env)
		if err != nil {
			t.Fatal(err)
		}
		opts, err := cfg.PoolOptions(Host{Cores: 2})
		if err != nil {
			t.Fatal(err)
		}
		pool, err := gpupool.New(t.Context(), func(gpupool.Device) (gpupool.Engine, error) { return oneEngine{}, nil }, opts...)
		if err != nil {
			t.Fatal(err)
		}
		tokens, rows := pool.BatchShape()
		_ = pool.Close(t.Context())
		if tokens != tc.wantTokens || rows != tc.wantRows {
			t.Errorf("%v: CPU pool shape %d tokens, %d rows, want %d, %d", tc.env, tokens, rows, tc.wantTokens, tc.wantRows)
		}
	}
}

// TestRelAttnRewriteSetting: REL_ATTENTION_REWRITE is on by default and
// reaches the model's load options, inverted, as the only switch.
func TestRelAttnRewriteSetting(t *testing.T) {
	for env, keep := range map[string]bool{"": false, "true": false, "false": true} {
		vars := map[string]string{"MODEL_DIR": t.TempDir()}
		if env != "" {
			vars["REL_ATTENTION_REWRITE"] = env
		}
		cfg, err := parseConfig(t, vars)
		if err != nil {
			t.Fatal(err)
		}
		lo, err := cfg.ModelOptions()
		if err != nil {
			t.Fatal(err)
		}
		if lo.KeepRelativeAttention != keep {
			t.Errorf("REL_ATTENTION_REWRITE=%q: KeepRelativeAttention %t, want %t", env, lo.KeepRelativeAttention, keep)
		}
	}
}

// TestAttentionRewritesSetting: ATTENTION_REWRITES defaults to every
// rewrite but mha, reaches the model's load options as given, and a name
// the model does not know, or mha without mask, fails validation naming
// the setting.
func TestAttentionRewritesSetting(t *testing.T) {
	for env, want := range map[string]string{"": "align,scale,mask,skipln", "none": "none", "mask,mha": "mask,mha"} {
		vars := map[string]string{"MODEL_DIR": t.TempDir()}
		if env != "" {
			vars["ATTENTION_REWRITES"] = env
		}
		cfg, err := parseConfig(t, vars)
		if err != nil {
			t.Fatalf("ATTENTION_REWRITES=%q: %v", env, err)
		}
		lo, err := cfg.ModelOptions()
		if err != nil {
			t.Fatal(err)
		}
		if lo.AttentionRewrites != want {
			t.Errorf("ATTENTION_REWRITES=%q: load options %q, want %q", env, lo.AttentionRewrites, want)
		}
	}
	for _, bad := range []string{"align,flash", "mha"} {
		if _, err := parseConfig(t, map[string]string{"MODEL_DIR": t.TempDir(), "ATTENTION_REWRITES": bad}); err == nil ||
			!strings.Contains(err.Error(), "ATTENTION_REWRITES") {
			t.Errorf("ATTENTION_REWRITES=%q: %v, want an error naming the setting", bad, err)
		}
	}
}

// TestGPUCalibrationCacheSetting: GPU_CALIBRATION_CACHE resolves as
// CPU_CALIBRATION_CACHE does (auto, off, a directory), and the pool
// PoolOptions builds keeps a GPU's calibration there, so a second start
// runs no calibration batch; off keeps nothing.
func TestGPUCalibrationCacheSetting(t *testing.T) {
	userCache, err := os.UserCacheDir()
	if err != nil {
		t.Fatal(err)
	}
	for setting, want := range map[string]string{
		"auto":              filepath.Join(userCache, "scorer", "gpu-calibration"),
		"off":               "",
		"Off":               "",
		"/var/cache/scorer": "/var/cache/scorer",
	} {
		if got := calibrationCache(setting, "gpu-calibration"); got != want {
			t.Errorf("GPU_CALIBRATION_CACHE=%s: %q, want %q", setting, got, want)
		}
	}
	start := func(t *testing.T, setting string) int {
		t.Helper()
		cfg, err := parseConfig(t, map[string]string{"DEVICE": "cuda", "GPU_CALIBRATION_CACHE": setting})
		if err != nil {
			t.Fatal(err)
		}
		opts, err := cfg.PoolOptions(Host{Cores: 2})
		if err != nil {
			t.Fatal(err)
		}
		gpu := &growingGPU{}
		pool, err := gpupool.New(t.Context(), func(gpupool.Device) (gpupool.Engine, error) { return gpu, nil },
			append(opts, gpupool.WithProbe(gpu), gpupool.CPUFallback(false))...)
		if err != nil {
			t.Fatal(err)
		}
		_ = pool.Close(t.Context())
		gpu.mu.Lock()
		defer gpu.mu.Unlock()
		return gpu.runs
	}
	dir := t.TempDir()
	if runs := start(t, dir); runs == 0 {
		t.Fatal("first start ran no calibration batch")
	}
	if runs := start(t, dir); runs != 0 {
		t.Errorf("GPU_CALIBRATION_CACHE=%s: the second start ran %d calibration batches, want none", dir, runs)
	}
	if m, _ := filepath.Glob(filepath.Join(dir, "gpu-*.json")); len(m) != 1 {
		t.Errorf("kept: %v, want one gpu-*.json", m)
	}
	if runs := start(t, "off"); runs == 0 {
		t.Error("GPU_CALIBRATION_CACHE=off: no calibration batch ran")
	}
}

// growingGPU is one fake GPU and the engine on it: its used memory grows
// to the largest batch it ran (rows·len·(64 KiB + 64·len) bytes), and the
// engine names a memory key, as model.Session does. runs counts the
// calibration shapes it ran.
type growingGPU struct {
	mu   sync.Mutex
	used uint64
	runs int
}

func (g *growingGPU) ScorePairs(_ context.Context, pairs []model.Pair) ([]float32, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	l := uint64(pairs[0].Len())
	if len(pairs) > 1 || l > 8 {
		g.runs++ // a calibration shape, not the one-row warm-up
	}
	g.used = max(g.used, uint64(len(pairs))*l*(64<<10+64*l))
	return make([]float32, len(pairs)), nil
}
func (*growingGPU) Close() error      { return nil }
func (*growingGPU) MemoryKey() string { return "model=test" }
func (*growingGPU) MaxLength() int    { return 512 }
func (g *growingGPU) Devices() ([]gpupool.DeviceInfo, error) {
	return []gpupool.DeviceInfo{{UUID: "GPU-test", Name: "Test GPU", TotalMemory: 80 << 30}}, nil
}
func (g *growingGPU) MemoryInfo(int) (free, used, total uint64, err error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return 80<<30 - g.used, g.used, 80 << 30, nil
}

// ProcessMemory reads the engine's memory as NVML does where it lists our
// PID: gpupool keeps no fit read device-wide from an arena that is never
// emptied, as it cannot tell another process's memory from ours there.
func (g *growingGPU) ProcessMemory(int) (uint64, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.used, nil
}
func (*growingGPU) Utilization(int) (uint32, error) { return 0, nil }
func (*growingGPU) Throttled(int) (uint64, error)   { return 0, nil }

// TestStartOffsetSetting: KAFKA_START_OFFSET (Kafka's auto.offset.reset)
// says where a group without a committed offset starts, earliest by
// default, and reaches the consumer; anything else fails validation naming
// it.
func TestStartOffsetSetting(t *testing.T) {
	for env, want := range map[string]int64{"": kafka.FirstOffset, "earliest": kafka.FirstOffset, "latest": kafka.LastOffset} {
		vars := map[string]string{}
		if env != "" {
			vars["KAFKA_START_OFFSET"] = env
		}
		cfg, err := parseConfig(t, vars)
		if err != nil {
			t.Fatal(err)
		}
		if got := cfg.ConsumerConfig(KafkaSecurity{}).StartOffset; got != want {
			t.Errorf("KAFKA_START_OFFSET=%q: consumer StartOffset %d, want %d", env, got, want)
		}
	}
	if _, err := parseConfig(t, map[string]string{"KAFKA_START_OFFSET": "none"}); err == nil || !strings.Contains(err.Error(), "KAFKA_START_OFFSET") {
		t.Errorf("KAFKA_START_OFFSET=none: err = %v, want it refused", err)
	}
}

// TestPadToMultipleOfSetting: PAD_TO_MULTIPLE_OF=auto pads CUDA sessions'
// batches to multiples of 8 and leaves CPU sessions' at their longest
// pair; a number is both; zero, negatives and anything else are refused.
func TestPadToMultipleOfSetting(t *testing.T) {
	for env, want := range map[string][2]int{"": {1, 8}, "auto": {1, 8}, "1": {1, 1}, "16": {16, 16}} {
		vars := map[string]string{}
		if env != "" {
			vars["PAD_TO_MULTIPLE_OF"] = env
		}
		cfg, err := parseConfig(t, vars)
		if err != nil {
			t.Fatalf("PAD_TO_MULTIPLE_OF=%q: %v", env, err)
		}
		sc := cfg.SessionConfig(Host{})
		for i, kind := range []gpupool.DeviceKind{gpupool.CPU, gpupool.CUDA} {
			opts, err := gpupool.ModelSessionOptions(gpupool.Device{Kind: kind}, sc)
			if err != nil {
				t.Fatal(err)
			}
			if opts.PadToMultipleOf != want[i] {
				t.Errorf("PAD_TO_MULTIPLE_OF=%q: %v session pads to %d, want %d", env, kind, opts.PadToMultipleOf, want[i])
			}
		}
	}
	for _, v := range []string{"0", "-8", "eight", "8.5", "auto8"} {
		if _, err := parseConfig(t, map[string]string{"PAD_TO_MULTIPLE_OF": v}); err == nil || !strings.Contains(err.Error(), "PAD_TO_MULTIPLE_OF") {
			t.Errorf("PAD_TO_MULTIPLE_OF=%s: err = %v, want it refused", v, err)
		}
	}
}

// TestContradictionIndexSetting: CONTRADICTION_INDEX, the setting the
// model's "set the contradiction index explicitly" error names, reaches
// the load options as ENTAILMENT_INDEX does; -1 (the default) leaves the
// index to id2label, and below -1 fails validation naming the setting.
func TestContradictionIndexSetting(t *testing.T) {
	for env, want := range map[string]int{"": -1, "-1": -1, "0": 0, "2": 2} {
		vars := map[string]string{"MODEL_DIR": t.TempDir()}
		if env != "" {
			vars["CONTRADICTION_INDEX"] = env
		}
		cfg, err := parseConfig(t, vars)
		if err != nil {
			t.Fatalf("CONTRADICTION_INDEX=%q: %v", env, err)
		}
		lo, err := cfg.ModelOptions()
		if err != nil {
			t.Fatal(err)
		}
		got := -1
		if lo.ContradictionIndex != nil {
			got = *lo.ContradictionIndex
		}
		if got != want || (want < 0) != (lo.ContradictionIndex == nil) {
			t.Errorf("CONTRADICTION_INDEX=%q: load options' ContradictionIndex %v (%d), want %d", env, lo.ContradictionIndex, got, want)
		}
	}
	if _, err := parseConfig(t, map[string]string{"MODEL_DIR": t.TempDir(), "CONTRADICTION_INDEX": "-2"}); err == nil || !strings.Contains(err.Error(), "CONTRADICTION_INDEX") {
		t.Errorf("CONTRADICTION_INDEX=-2: %v; want an error naming CONTRADICTION_INDEX", err)
	}
}

// TestModelNameSetting: MODEL_NAME reaches the load options (the model
// package's TestModelName checks what Load makes of it and of its absence).
func TestModelNameSetting(t *testing.T) {
	for _, env := range []string{"", "consumer-weakness-v3"} {
		cfg, err := parseConfig(t, map[string]string{"MODEL_DIR": t.TempDir(), "MODEL_NAME": env})
		if err != nil {
			t.Fatal(err)
		}
		lo, err := cfg.ModelOptions()
		if err != nil {
			t.Fatal(err)
		}
		if lo.Name != env {
			t.Errorf("MODEL_NAME=%q: load options' Name %q", env, lo.Name)
		}
	}
}
