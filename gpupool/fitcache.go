package gpupool

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// fitCache is one memory calibration's place in a cache directory (the CPU
// engine's, CPUMemoryConfig.CacheDir, or a GPU's, GPUCalibrationCache);
// nil when nothing is kept (no directory, or an engine that cannot name
// what its memory depends on). loadFit and storeFit are safe on nil.
type fitCache struct {
	key, path string
	// kind names the device in errors: "cpu" or "gpu".
	kind string
}

// newFitCache is key's place in dir: the key is written in full inside
// the file, so a file is trusted only for exactly that key, and the file is
// named by the key's hash.
func newFitCache(dir, kind, key string) *fitCache {
	sum := sha256.Sum256([]byte(key))
	return &fitCache{key: key, kind: kind, path: filepath.Join(dir, kind+"-"+hex.EncodeToString(sum[:12])+".json")}
}

// keptFit is a kept calibration: the fit, the key it was measured under
// and, for a person reading it, the readings and when.
type keptFit[F any] struct {
	Key        string     `json:"key"`
	Fit        F          `json:"fit"`
	Points     []fitPoint `json:"points"`
	Calibrated time.Time  `json:"calibrated"`
}

type fitPoint struct {
	Rows  int     `json:"rows"`
	Len   int     `json:"len"`
	Bytes float64 `json:"bytes"`
}

// loadFit returns the kept fit for c's key, or why there is none for the
// log: no file, an unreadable or corrupt one, one for another key, or one
// whose fit is unusable (it is then measured again and overwritten). It
// first removes what writers that died mid-write left there (sweepTemp).
func loadFit[F interface{ usable() bool }](c *fitCache) (fit F, miss string) {
	if c == nil {
		return fit, "no cache"
	}
	sweepTemp(filepath.Dir(c.path), c.kind)
	f, err := os.Open(c.path)
	if errors.Is(err, fs.ErrNotExist) {
		return fit, "none kept"
	}
	if err != nil {
		return fit, "unreadable: " + err.Error()
	}
	defer f.Close()
	var file keptFit[F]
	switch err := json.NewDecoder(io.LimitReader(f, 1<<20)).Decode(&file); {
	case err != nil:
		return fit, "corrupt: " + err.Error()
	case file.Key != c.key:
		return fit, "kept for another key"
	case !file.Fit.usable():
		return fit, "unusable fit"
	}
	return file.Fit, ""
}

// storeFit keeps fit and its readings under c's key, replacing the file
// whole (written beside it, then renamed) so a reader never sees half of
// it. The directory and the file get the modes the umask leaves of 0777 and
// 0666, as any file the process writes would: the umask decides who else
// may read the cache (022) or share it (002 with a common group), and
// fixed owner-only modes made a volume shared by pods of other UIDs
// unusable to them.
func storeFit[F any](c *fitCache, fit F, pts []memPoint) error {
	if c == nil {
		return nil
	}
	file := keptFit[F]{Key: c.key, Fit: fit, Calibrated: time.Now().UTC()}
	for _, pt := range pts {
		file.Points = append(file.Points, fitPoint{Rows: pt.rows, Len: pt.length, Bytes: pt.bytes})
	}
	data, err := json.MarshalIndent(file, "", "  ")
	if err != nil {
		return err
	}
	dir := filepath.Dir(c.path)
	if err := os.MkdirAll(dir, 0o777); err != nil {
		return fmt.Errorf("gpupool: %s: calibration cache: %w", c.kind, err)
	}
	tmp, err := createTemp(dir, "."+c.kind+"-")
	if err != nil {
		return fmt.Errorf("gpupool: %s: calibration cache: %w", c.kind, err)
	}
	_, werr := tmp.Write(append(data, '\n'))
	if err := errors.Join(werr, tmp.Close()); err != nil {
		_ = os.Remove(tmp.Name())
		return fmt.Errorf("gpupool: %s: calibration cache: %w", c.kind, err)
	}
	if err := os.Rename(tmp.Name(), c.path); err != nil {
		_ = os.Remove(tmp.Name())
		return fmt.Errorf("gpupool: %s: calibration cache: %w", c.kind, err)
	}
	return nil
}

// createTemp creates a new file prefix+random+".tmp" in dir, as
// os.CreateTemp does but at 0666 less the umask where CreateTemp fixes
// 0600.
func createTemp(dir, prefix string) (*os.File, error) {
	for range 100 {
		name := filepath.Join(dir, prefix+strconv.FormatUint(rand.Uint64(), 36)+".tmp")
		f, err := os.OpenFile(name, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o666)
		if !errors.Is(err, fs.ErrExist) {
			return f, err
		}
	}
	return nil, fmt.Errorf("%s: no unused temporary name for %s*.tmp", dir, prefix)
}

// staleTemp is how old a temporary file of storeFit's must be for a start
// to remove it. One lives for the milliseconds a write of a few KB takes,
// so one this old was left by a writer that died between writing and
// renaming it (a crash, an OOM kill); the margin is for the clocks of
// other hosts sharing the volume, which stamp their own files.
const staleTemp = 10 * time.Minute

// sweepTemp removes kind's temporary files older than staleTemp from dir.
// Nothing else cleans them up, and every crash mid-write would leave one
// for good. Failing is harmless (another UID's file, a read-only volume):
// what storeFit cannot write it reports itself.
func sweepTemp(dir, kind string) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	for _, e := range entries {
		name := e.Name()
		if !e.Type().IsRegular() || !strings.HasPrefix(name, "."+kind+"-") || !strings.HasSuffix(name, ".tmp") {
			continue
		}
		if fi, err := e.Info(); err == nil && time.Since(fi.ModTime()) > staleTemp {
			_ = os.Remove(filepath.Join(dir, name))
		}
	}
}

// usableTerms reports whether a fit's terms could have come from a fit:
// finite and not negative.
func usableTerms(vs ...float64) bool {
	for _, v := range vs {
		if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
			return false
		}
	}
	return true
}

// memoryKey is what eng says its memory depends on (model.Session's
// MemoryKey); "" when it cannot say, and then nothing is cached.
func memoryKey(eng Engine) string {
	if k, ok := eng.(interface{ MemoryKey() string }); ok {
		return k.MemoryKey()
	}
	return ""
}
