package config

import (
	"path/filepath"
	"testing"

	"github.com/scorer/scorer/gpupool"
)

// TestGraphCacheTrustedSetting: GRAPH_CACHE_TRUSTED reaches the CPU
// session's options with GRAPH_CACHE (off by default: a start then loads
// only entries no other user can have written), and CUDA sessions, which
// keep no graph cache, get neither.
func TestGraphCacheTrustedSetting(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "graph")
	for env, want := range map[string]bool{"": false, "false": false, "true": true} {
		vars := map[string]string{"GRAPH_CACHE": dir}
		if env != "" {
			vars["GRAPH_CACHE_TRUSTED"] = env
		}
		cfg, err := parseConfig(t, vars)
		if err != nil {
			t.Fatalf("GRAPH_CACHE_TRUSTED=%q: %v", env, err)
		}
		sc := cfg.SessionConfig(Host{})
		cpu, err := gpupool.ModelSessionOptions(gpupool.Device{Kind: gpupool.CPU}, sc)
		if err != nil {
			t.Fatal(err)
		}
		if cpu.GraphCache != dir || cpu.GraphCacheTrusted != want {
			t.Errorf("GRAPH_CACHE_TRUSTED=%q: CPU session's cache %q, trusted %t; want %q, %t", env, cpu.GraphCache, cpu.GraphCacheTrusted, dir, want)
		}
		cuda, err := gpupool.ModelSessionOptions(gpupool.Device{Kind: gpupool.CUDA}, sc)
		if err != nil {
			t.Fatal(err)
		}
		if cuda.GraphCache != "" || cuda.GraphCacheTrusted {
			t.Errorf("GRAPH_CACHE_TRUSTED=%q: CUDA session's cache %q, trusted %t; want none", env, cuda.GraphCache, cuda.GraphCacheTrusted)
		}
	}
}
