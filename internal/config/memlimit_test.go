package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/scorer/scorer/gpupool"
)

// fakeRoot writes files (path relative to root → content) into a temp dir.
func fakeRoot(t *testing.T, files map[string]string) string {
	t.Helper()
	root := t.TempDir()
	for p, c := range files {
		f := filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(f), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(f, []byte(c), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

func TestDetectMemoryLimit(t *testing.T) {
	const meminfo = "MemTotal:       24685260 kB\nMemFree:        1000 kB\n"
	phys := uint64(24685260) << 10
	tests := []struct {
		name  string
		files map[string]string
		want  MemoryLimit
	}{
		{"v2 in a cgroup namespace", map[string]string{
			"proc/meminfo": meminfo, "proc/self/cgroup": "0::/\n", "sys/fs/cgroup/memory.max": "4294967296\n",
		}, MemoryLimit{4 << 30, "cgroup v2 memory.max"}},
		{"v2 nested: a parent's lower limit binds", map[string]string{
			"proc/meminfo": meminfo, "proc/self/cgroup": "0::/kubepods/pod1/ctr\n",
			"sys/fs/cgroup/kubepods/pod1/ctr/memory.max": "max\n",
			"sys/fs/cgroup/kubepods/pod1/memory.max":     "3221225472\n",
			"sys/fs/cgroup/kubepods/memory.max":          "8589934592\n",
		}, MemoryLimit{3 << 30, "cgroup v2 memory.max"}},
		{"v2 without a limit", map[string]string{
			"proc/meminfo": meminfo, "proc/self/cgroup": "0::/\n", "sys/fs/cgroup/memory.max": "max\n",
		}, MemoryLimit{phys, "physical memory"}},
		{"v1", map[string]string{
			"proc/meminfo": meminfo, "proc/self/cgroup": "12:cpu,cpuacct:/\n4:memory:/docker/abc\n",
			"sys/fs/cgroup/memory/docker/abc/memory.limit_in_bytes": "2147483648\n",
		}, MemoryLimit{2 << 30, "cgroup v1 memory.limit_in_bytes"}},
		{"v1 unlimited", map[string]string{
			"proc/meminfo": meminfo, "proc/self/cgroup": "4:memory:/\n",
			"sys/fs/cgroup/memory/memory.limit_in_bytes": "9223372036854771712\n",
		}, MemoryLimit{phys, "physical memory"}},
		{"a limit above physical memory is none", map[string]string{
			"proc/meminfo": meminfo, "proc/self/cgroup": "0::/\n", "sys/fs/cgroup/memory.max": "68719476736\n",
		}, MemoryLimit{phys, "physical memory"}},
		{"nothing readable", map[string]string{}, MemoryLimit{}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := DetectMemoryLimit(fakeRoot(t, tc.files)); got != tc.want {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

func cpuMemory(c Config, h Host) (*gpupool.CPUMemoryConfig, MemoryLimit, error) {
	return c.CPUMemory(h)
}

// TestCPUMemoryConfig checks how CPU_MEM_LIMIT and CPU_MAX_BATCH_BYTES
// become the pool's budget: the reserve counts the score cache, in-flight
// input and a tenth of the limit.
func TestCPUMemoryConfig(t *testing.T) {
	host := Host{Cores: 2, Memory: MemoryLimit{8 << 30, "cgroup v2 memory.max"}}
	base := func(set func(*Config)) Config {
		c, err := FromEnv(func(string) string { return "" })
		if err != nil {
			t.Fatal(err)
		}
		set(&c)
		return c
	}
	c, lim, err := cpuMemory(base(func(*Config) {}), host)
	if err != nil || c == nil || lim.Source != "cgroup v2 memory.max" || c.Limit != 8<<30 || c.BatchBytes != 0 || c.RefLen != 128 {
		t.Fatalf("defaults: %+v %+v %v", c, lim, err)
	}
	want := uint64(256<<20) + 2*2*8<<20 + (8<<30)/10
	if c.Reserve != want {
		t.Errorf("reserve %d, want cache + 2 × in-flight input + limit/10 = %d", c.Reserve, want)
	}
	if c, _, err := cpuMemory(base(func(c *Config) { c.CPUMemLimit = "0.5" }), host); err != nil || c.Limit != 4<<30 {
		t.Errorf("fraction: %+v %v", c, err)
	}
	if c, _, err := cpuMemory(base(func(c *Config) { c.CPUMemLimit = "0"; c.CPUMaxBatchBytes = "512MiB" }), host); err != nil || c.Limit != 0 || c.Reserve != 0 || c.BatchBytes != 512<<20 {
		t.Errorf("no limit, explicit batch bytes: %+v %v", c, err)
	}
	if c, _, err := cpuMemory(base(func(c *Config) { c.CPUMaxBatchBytes = "off" }), host); err != nil || c != nil {
		t.Errorf("off: %+v %v", c, err)
	}
	userCache, err := os.UserCacheDir()
	if err != nil {
		t.Fatal(err)
	}
	for setting, dir := range map[string]string{
		"auto":              filepath.Join(userCache, "scorer", "cpu-calibration"),
		"off":               "",
		"OFF":               "",
		"/var/cache/scorer": "/var/cache/scorer",
	} {
		if c, _, err := cpuMemory(base(func(c *Config) { c.CPUCalibrationCache = setting }), host); err != nil || c.CacheDir != dir {
			t.Errorf("CPU_CALIBRATION_CACHE=%s: cache dir %q, %v; want %q", setting, c.CacheDir, err, dir)
		}
	}
	for _, bad := range []func(*Config){
		func(c *Config) { c.CPUMemLimit = "lots" },
		func(c *Config) { c.CPUMaxBatchBytes = "0.5" },
		func(c *Config) { c.CPUMemLimit = "100MiB" }, // below the score cache alone
	} {
		if _, _, err := cpuMemory(base(bad), host); err == nil || !strings.Contains(err.Error(), "CPU_M") {
			t.Errorf("bad setting accepted or unclear: %v", err)
		}
	}
}
