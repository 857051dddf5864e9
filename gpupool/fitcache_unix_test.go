//go:build unix

package gpupool

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// The calibration caches leave modes to the umask, as any file the
// process writes: with umask 002 and a shared group (Kubernetes' fsGroup)
// pods running as other UIDs read and replace each other's files; with
// 022 they read them; with 077 nobody else does.
func TestCalibrationCacheModesFollowUmask(t *testing.T) {
	for _, tc := range []struct {
		umask             int
		dirMode, fileMode os.FileMode
	}{
		{0o002, 0o775, 0o664},
		{0o022, 0o755, 0o644},
		{0o077, 0o700, 0o600},
	} {
		dir := filepath.Join(t.TempDir(), "cache")
		runs := func() int {
			defer syscall.Umask(syscall.Umask(tc.umask))
			fake := &fakeEngine{}
			_, runs := startCPUCalibration(t, keyedEngine{fakeEngine: fake, key: "model=a"}, fake, 2<<30, CPUMemoryConfig{CacheDir: dir})
			return runs
		}()
		if runs == 0 {
			t.Fatal("calibrated nothing")
		}
		files, err := filepath.Glob(filepath.Join(dir, "cpu-*.json"))
		if err != nil || len(files) != 1 {
			t.Fatalf("kept %v (%v), want one file", files, err)
		}
		for path, want := range map[string]os.FileMode{dir: tc.dirMode, files[0]: tc.fileMode} {
			fi, err := os.Stat(path)
			if err != nil {
				t.Fatal(err)
			}
			if got := fi.Mode().Perm(); got != want {
				t.Errorf("umask %03o: %s has mode %03o, want %03o", tc.umask, path, got, want)
			}
		}
	}
}
