package model

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	ort "github.com/yalue/onnxruntime_go"

	"github.com/scorer/scorer/model/ortenv"
)

// GraphCacheDir is SessionOptions.GraphCache of the session.
func (s *Session) GraphCacheDir() string { return s.opts.GraphCache }

// BuildGraphCache writes the entry that later sessions with the options s
// was created with load instead of optimising the graph and packing its
// weights (SessionOptions.GraphCache), replacing the entry of the same
// key and removing the model slot's entries of other versions
// (removeOtherEntries). It refuses a folder others can write unless it is
// trusted (a start would not load the entry). It creates one more
// session for it, on a thread of its own at the lowest CPU priority (nice
// 19) and one intra-op thread, while ORT
// optimises the graph and writes it with its prepacked weights (about the
// model's size twice over on disk, and as much memory again while it runs,
// for seconds to minutes); the entry becomes visible whole, by a rename,
// once written and checked. Call it once the scorer is ready: it is what a
// later start saves, and costs this one nothing it waits for. ctx stops it
// between its steps; ORT's session creation cannot be interrupted, and the
// environment stays loaded for it (ortenv.Pin) after its owner's shutdown.
// Returns the entry's folder.
func (s *Session) BuildGraphCache(ctx context.Context) (string, error) {
	m, opts := s.m, s.opts
	key := sessionOpts(opts).graphCacheKey(m)
	if opts.GraphCache == "" || key == "" {
		return "", errors.New("model: the session has no graph cache")
	}
	if m.SHA256 == "" {
		return "", errors.New("model: the model's version is not known yet")
	}
	// ORT's session creation cannot be interrupted, so a process may end
	// its scorer, and the environment's owner shut it down, while this
	// runs: the pin keeps the environment for it (and for a scorer started
	// after in the same process), and the last unpin destroys it.
	unpin, ok := ortenv.Pin()
	if !ok {
		return "", errors.New("model: no ONNX Runtime environment to write the graph cache in")
	}
	defer unpin()
	dir := opts.GraphCache
	done := make(chan struct{})
	var entry string
	var err error
	go func() {
		defer close(done)
		// The thread ends with this goroutine (never unlocked), taking its
		// priority with it; ORT's threads started from it inherit it.
		runtime.LockOSThread()
		lowerPriority()
		entry, err = m.buildGraphCache(ctx, dir, key, opts)
	}()
	<-done
	return entry, err
}

// buildGraphCache is BuildGraphCache on its thread.
func (m *Model) buildGraphCache(ctx context.Context, dir, key string, opts SessionOptions) (string, error) {
	fail := func(err error) (string, error) {
		return "", fmt.Errorf("model: writing the graph cache in %s: %w", dir, err)
	}
	// Unless the folder is trusted, what is written here is its owner's
	// to write alone, whatever the umask, or no start would load it
	// (untrustedFile); a trusted folder is shared as the umask says.
	dirMode, fileMode := os.FileMode(0o755), os.FileMode(0o644)
	if opts.GraphCacheTrusted {
		dirMode, fileMode = 0o777, 0o666
	}
	if err := os.MkdirAll(dir, dirMode); err != nil {
		return fail(err)
	}
	if !opts.GraphCacheTrusted {
		if why, _ := untrustedPath(dir); why != "" {
			return fail(fmt.Errorf("%s; a start would not load an entry written there (make it writable by its owner only, or set it trusted)", why))
		}
	}
	sweepGraphTemp(dir)
	entry := graphCacheEntry(dir, key)
	tmp, err := mkdirTemp(dir, "."+filepath.Base(entry)+"-", dirMode)
	if err != nil {
		return fail(err)
	}
	// Held until this build ends, or its process does: a build that
	// finds the folder unlocked knows its writer is gone (sweepGraphTemp).
	if lock, ok := lockDir(tmp); ok {
		defer lock.Close()
	}
	keep := false
	defer func() {
		if !keep {
			_ = os.RemoveAll(tmp)
		}
	}()
	// The files as they are now; the session below reads them, and an
	// entry is only kept if they did not change (checkFiles after it).
	m.filesMu.Lock()
	files := make([]graphCacheStamp, len(m.held))
	for i, h := range m.held {
		files[i] = graphCacheStamp{Path: h.real, Size: h.stamp.size, MTime: h.stamp.mtime}
	}
	slot := graphCacheSlot(m.held[0].path)
	m.filesMu.Unlock()
	if err := m.writeOptimized(tmp, opts); err != nil {
		return fail(err)
	}
	if !opts.GraphCacheTrusted {
		// ORT writes its files at modes of its own less the umask.
		for _, name := range []string{graphCacheGraph, graphCacheData} {
			p := filepath.Join(tmp, name)
			st, err := os.Stat(p)
			if err == nil {
				err = os.Chmod(p, st.Mode().Perm()&^0o022)
			}
			if err != nil {
				return fail(err)
			}
		}
	}
	if err := m.checkFiles(); err != nil {
		return fail(err)
	}
	if err := ctx.Err(); err != nil {
		return fail(err)
	}
	man := graphManifest{Format: graphCacheFormat, Key: key, ModelSlot: slot, ModelSHA256: m.SHA256, ModelFiles: files, Written: time.Now().UTC()}
	graph, err := os.ReadFile(filepath.Join(tmp, graphCacheGraph))
	if err != nil {
		return fail(err)
	}
	sum := sha256.Sum256(graph)
	man.GraphBytes, man.GraphSHA = int64(len(graph)), hex.EncodeToString(sum[:])
	f, err := os.Open(filepath.Join(tmp, graphCacheData))
	if err != nil {
		return fail(err)
	}
	st, err := f.Stat()
	if err == nil {
		man.DataBytes = st.Size()
		man.DataCRC, err = crcOf(f)
	}
	f.Close()
	if err != nil {
		return fail(err)
	}
	b, err := json.MarshalIndent(man, "", "  ")
	if err != nil {
		return fail(err)
	}
	if err := os.WriteFile(filepath.Join(tmp, graphCacheManifest), append(b, '\n'), fileMode); err != nil {
		return fail(err)
	}
	if err := ctx.Err(); err != nil {
		return fail(err)
	}
	// The old entry is moved aside, not written over: a session of
	// another process may map its data file, which stays valid until
	// unmapped once unlinked, and a start checking it sees it replaced
	// (cachedGraph.unchanged).
	old := ""
	if _, err := os.Stat(entry); err == nil {
		old = tmp + ".old"
		if err := os.Rename(entry, old); err != nil {
			return fail(err)
		}
	}
	if err := os.Rename(tmp, entry); err != nil {
		return fail(err)
	}
	keep = true
	if old != "" {
		_ = os.RemoveAll(old)
	}
	removeOtherEntries(dir, entry, man)
	return entry, nil
}

// writeOptimized has ORT optimise m's graph as a session with opts would,
// and save it with its prepacked weights in dir.
func (m *Model) writeOptimized(dir string, opts SessionOptions) error {
	so, err := ort.NewSessionOptions()
	if err != nil {
		return err
	}
	defer so.Destroy()
	// One intra-op thread: the build runs beside the scorer's own
	// sessions, and neither ORT's optimisation nor what it writes depends
	// on the thread count (the key still names the sessions' count).
	if err := so.SetIntraOpNumThreads(1); err != nil {
		return err
	}
	if opts.DisableMemPattern {
		if err := so.SetMemPattern(false); err != nil {
			return err
		}
	}
	for k, v := range map[string]string{
		externalFolderKey:                                                 m.graphDir,
		"session.optimized_model_filepath":                                filepath.Join(dir, graphCacheGraph),
		"session.optimized_model_external_initializers_file_name":         graphCacheData,
		"session.optimized_model_external_initializers_min_size_in_bytes": "1024",
		"session.save_external_prepacked_constant_initializers":           "1",
	} {
		if err := so.AddSessionConfigEntry(k, v); err != nil {
			return fmt.Errorf("session option %s: %w", k, err)
		}
	}
	sess, err := ort.NewDynamicAdvancedSessionWithONNXData(m.graph, m.InputNames, []string{m.OutputName}, so)
	if err != nil {
		return fmt.Errorf("optimising the graph: %w", err)
	}
	err = sess.Destroy()
	// What the session held (the optimiser's copies, the packed weights)
	// goes back to the system rather than staying resident beside the
	// scorer's own sessions.
	ortenv.TrimMalloc()
	return err
}

// removeOtherEntries removes the entries in dir other than keep, whose
// manifest is ours, that no start of our model slot can load again: those
// of the slot's other versions (whatever settings wrote them) and of
// another format. Entries of the same version under other settings, ONNX
// Runtime releases or CPUs stay, for the pods that run them beside us;
// those of other slots (another model sharing the folder) are theirs. So
// a folder holds, per model slot, the entries of one version (the last
// written), one per set of settings that wrote one.
func removeOtherEntries(dir, keep string, ours graphManifest) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	for _, e := range entries {
		p := filepath.Join(dir, e.Name())
		if !e.IsDir() || !strings.HasPrefix(e.Name(), graphCachePrefix) || p == keep {
			continue
		}
		b, err := readLimited(filepath.Join(p, graphCacheManifest), 1<<20)
		var man graphManifest
		if err != nil || json.Unmarshal(b, &man) != nil {
			// Without a manifest an entry is no use to anyone: a
			// writer died before its rename could not leave one (it
			// renames whole folders), so it is damaged.
			_ = os.RemoveAll(p)
			continue
		}
		same := man.ModelSlot != "" && man.ModelSlot == ours.ModelSlot
		if man.ModelSlot == "" {
			// Format 1 named no slot: its entries were the model
			// file's at its real path.
			same = len(man.ModelFiles) > 0 && man.ModelFiles[0].Path == ours.ModelFiles[0].Path
		}
		if same && (man.Format != ours.Format || man.ModelSHA256 != ours.ModelSHA256) {
			_ = os.RemoveAll(p)
		}
	}
}

// staleGraphTemp is how old a temporary folder of buildGraphCache must be
// for a build to remove it where folders cannot be locked: one is written
// for minutes (98 s on the loaded 2 cores for the production stand-in,
// longer at nice 19 beside busy neighbours); older ones were left by a
// process that exited or died mid-write.
const staleGraphTemp = time.Hour

// sweepGraphTemp removes the temporary folders of builds that ended
// without removing them: a process that exited before its build was
// written (a short `scorer score`) or died. On Linux a folder whose lock
// (lockDir) nobody holds is such a one, whatever its age: its writer is
// gone, and it may hold gigabytes. Elsewhere, folders older than
// staleGraphTemp.
func sweepGraphTemp(dir string) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	for _, e := range entries {
		name := e.Name()
		if !strings.HasPrefix(name, "."+graphCachePrefix) || !strings.Contains(name, ".tmp") {
			continue
		}
		p := filepath.Join(dir, name)
		if lock, ok := lockDir(p); ok {
			_ = os.RemoveAll(p)
			lock.Close()
		} else if fi, err := e.Info(); err == nil && runtime.GOOS != "linux" && time.Since(fi.ModTime()) > staleGraphTemp {
			_ = os.RemoveAll(p)
		}
	}
}

// mkdirTemp creates a new folder prefix+random+".tmp" in dir at mode less
// the umask (os.MkdirTemp fixes 0700, which a trusted folder shared by a
// group would not want).
func mkdirTemp(dir, prefix string, mode os.FileMode) (string, error) {
	for range 100 {
		name := filepath.Join(dir, prefix+strconv.FormatUint(rand.Uint64(), 36)+".tmp")
		err := os.Mkdir(name, mode)
		if !errors.Is(err, fs.ErrExist) {
			return name, err
		}
	}
	return "", fmt.Errorf("%s: no unused temporary name for %s*.tmp", dir, prefix)
}
