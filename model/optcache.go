package model

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
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

// The graph cache keeps ONNX Runtime's optimised graph of a CPU session
// between starts, with MLAS's prepacked weights (SessionOptions.GraphCache).
//
// Why: creating a CPU session on the production-size DeBERTa is most of a
// start (11-16 s on 2 cores, docs/benchmarks.md): ORT's graph optimisation
// and MLAS's packing of every MatMul weight, about equal. Both give the same
// result for the same graph, ORT release and CPU, so ORT is asked to save
// them once (session.optimized_model_filepath with the prepacked constants
// in its external data file) and later sessions load that graph with
// optimisation off; ORT then maps the prepacked weights from the file
// instead of packing them.
//
// An entry is a folder, graphCachePrefix + the hash of its key: the graph
// (graphCacheGraph), its data (graphCacheData) and a manifest naming the
// key in full, the model version it was made from, and each file's size
// and checksum. A start trusts an entry only when all of these match
// (loadGraphCache): a file cut short, changed or left by another key or
// model version is refused with the reason, and never given to ORT.
const (
	graphCacheFormat   = "ort-optimized-prepacked-1"
	graphCachePrefix   = "graph-"
	graphCacheGraph    = "graph.onnx"
	graphCacheData     = "graph.onnx.data"
	graphCacheManifest = "manifest.json"
)

// graphManifest is an entry's manifest.
type graphManifest struct {
	Format string `json:"format"`
	// Key is the entry's key in full (graphCacheKey).
	Key string `json:"key"`
	// ModelSHA256 is the model version the graph was optimised from; the
	// key names the model's files by path, the version is checked once
	// the model's hash is known (it is computed while the session loads).
	ModelSHA256 string `json:"model_sha256"`
	// ModelFiles are the model's files as they were when the entry was
	// written: a file changed since cannot be the same version, so such
	// an entry is not loaded at all.
	ModelFiles []graphCacheStamp `json:"model_files"`
	GraphBytes int64             `json:"graph_bytes"`
	GraphSHA   string            `json:"graph_sha256"`
	DataBytes  int64             `json:"data_bytes"`
	// DataCRC is the data file's CRC-32C: a SHA-256 of gigabytes would
	// cost seconds of the start it is meant to save; the checksum finds a
	// file cut short or damaged, and the manifest's key and version what
	// is not this model's.
	DataCRC uint32    `json:"data_crc32c"`
	Written time.Time `json:"written"`
}

type graphCacheStamp struct {
	Path  string `json:"path"`
	Size  int64  `json:"size"`
	MTime int64  `json:"mtime_ns"`
}

// GraphCacheResult says what NewSession made of SessionOptions.GraphCache:
// the entry the session was loaded from, or why none was (Miss). Build
// reports whether BuildGraphCache can write one for this session.
type GraphCacheResult struct {
	Path string
	Miss string
}

// Hit reports whether the session was loaded from the cache.
func (r GraphCacheResult) Hit() bool { return r.Path != "" && r.Miss == "" }

// graphCacheKey is everything the optimised graph and its prepacked
// weights depend on besides the model's bytes: the cache's format, the
// model's files (their real paths: one entry per model file, replaced when
// its version changes), the graph rewrite, ONNX Runtime's release, the
// session's options and the machine (OS, architecture, CPU model and
// features: MLAS packs weights in the layout of the kernels it picks for
// this CPU). "" when the session cannot be cached (execution providers
// added through Configure: their graphs and layouts are the device's).
func (s sessionOpts) graphCacheKey(m *Model) string {
	if s.Configure != nil {
		return ""
	}
	var b strings.Builder
	// checkFiles may replace held (the same paths, opened again).
	m.filesMu.Lock()
	fmt.Fprintf(&b, "format=%s model=%q", graphCacheFormat, m.held[0].real)
	for _, h := range m.held[1:] {
		fmt.Fprintf(&b, " data=%q", h.real)
	}
	m.filesMu.Unlock()
	fmt.Fprintf(&b, " max_len=%d rewritten=%t", m.MaxLength, m.relAttn)
	if m.relAttn {
		b.WriteString(" rewrites=" + m.rewrites)
	}
	fmt.Fprintf(&b, " ort=%s intra_op=%d inter_op=%d mem_pattern=%t pad_to=%d", ort.GetVersion(),
		s.IntraOpThreads, s.InterOpThreads, !s.DisableMemPattern, s.PadToMultipleOf)
	fmt.Fprintf(&b, " os=%s/%s cpu=%q", runtime.GOOS, runtime.GOARCH, ortenv.CPUIdentity())
	return b.String()
}

// sessionOpts is SessionOptions for the key's methods.
type sessionOpts SessionOptions

// graphCacheEntry is the folder of key's entry in dir.
func graphCacheEntry(dir, key string) string {
	sum := sha256.Sum256([]byte(key))
	return filepath.Join(dir, graphCachePrefix+hex.EncodeToString(sum[:12]))
}

// cachedGraph is an entry checked against its manifest, its data file
// open as it was checked.
type cachedGraph struct {
	dir   string
	man   graphManifest
	graph []byte
	data  *os.File
	stamp fileStamp
}

// loadGraphCache reads and checks key's entry in dir: "" and the entry,
// or why it cannot be used. The data file stays open (the caller closes
// it) so that what ORT opens can be compared with what was checked.
func (m *Model) loadGraphCache(dir, key string) (*cachedGraph, string) {
	entry := graphCacheEntry(dir, key)
	b, err := readLimited(filepath.Join(entry, graphCacheManifest), 1<<20)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, "none kept"
	}
	if err != nil {
		return nil, "unreadable: " + err.Error()
	}
	var man graphManifest
	switch err := json.Unmarshal(b, &man); {
	case err != nil:
		return nil, "corrupt manifest: " + err.Error()
	case man.Format != graphCacheFormat:
		return nil, "written in another format (" + man.Format + ")"
	case man.Key != key:
		return nil, "kept for another key"
	}
	m.filesMu.Lock()
	same := len(man.ModelFiles) == len(m.held)
	for i := 0; same && i < len(m.held); i++ {
		h := m.held[i]
		same = man.ModelFiles[i] == graphCacheStamp{Path: h.real, Size: h.stamp.size, MTime: h.stamp.mtime}
	}
	m.filesMu.Unlock()
	if !same {
		return nil, "the model's files changed since it was written"
	}
	graph, err := readLimited(filepath.Join(entry, graphCacheGraph), man.GraphBytes+1)
	if err != nil {
		return nil, "unreadable graph: " + err.Error()
	}
	if sum := sha256.Sum256(graph); int64(len(graph)) != man.GraphBytes || hex.EncodeToString(sum[:]) != man.GraphSHA {
		return nil, fmt.Sprintf("the graph file is damaged (%d bytes, manifest says %d, or another checksum)", len(graph), man.GraphBytes)
	}
	f, err := os.Open(filepath.Join(entry, graphCacheData))
	if err != nil {
		return nil, "unreadable data: " + err.Error()
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, "unreadable data: " + err.Error()
	}
	if st.Size() != man.DataBytes {
		f.Close()
		return nil, fmt.Sprintf("the data file has %d bytes, the manifest says %d", st.Size(), man.DataBytes)
	}
	sum, err := crcOf(f)
	if err != nil {
		f.Close()
		return nil, "unreadable data: " + err.Error()
	}
	if sum != man.DataCRC {
		f.Close()
		return nil, fmt.Sprintf("the data file is damaged (CRC-32C %08x, the manifest says %08x)", sum, man.DataCRC)
	}
	return &cachedGraph{dir: entry, man: man, graph: graph, data: f, stamp: stampOf(st)}, ""
}

// unchanged reports whether the data file ORT opened by path is still the
// one checked: an entry replaced (renamed over) or written meanwhile would
// have given ORT other bytes.
func (c *cachedGraph) unchanged() bool {
	st, err := c.data.Stat()
	if err != nil || stampOf(st) != c.stamp {
		return false
	}
	named, err := os.Stat(filepath.Join(c.dir, graphCacheData))
	return err == nil && os.SameFile(named, st)
}

// crcTable is CRC-32C's (Castagnoli), which Go computes with the CPU's
// own instruction where it has one.
var crcTable = crc32.MakeTable(crc32.Castagnoli)

// crcOf is the CRC-32C of f's whole content, read from its start in
// blocks of 4 MiB. Read, not mapped: mapping the 3 GB data file of the
// production stand-in and summing it took 8 s against 2.4 s read, on the
// loaded 2 cores, in page faults.
func crcOf(f *os.File) (uint32, error) {
	h := crc32.New(crcTable)
	if _, err := io.CopyBuffer(h, io.NewSectionReader(f, 0, 1<<62), make([]byte, 4<<20)); err != nil {
		return 0, err
	}
	return h.Sum32(), nil
}

// readLimited reads the file at path, failing past limit bytes.
func readLimited(path string, limit int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, limit))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) >= limit {
		return nil, fmt.Errorf("%s: larger than %d bytes", path, limit-1)
	}
	return b, nil
}

// newCachedSession creates the session from key's entry in dir, or says
// why it did not. It waits for the model's hash (computed beside session
// creation, and done before it on a production-size model) to check the
// entry's version, and discards a session whose entry was not the
// model's version or changed while ORT read it.
func (m *Model) newCachedSession(dir, key string, so *ort.SessionOptions) (*ort.DynamicAdvancedSession, GraphCacheResult) {
	res := GraphCacheResult{Path: graphCacheEntry(dir, key)}
	c, miss := m.loadGraphCache(dir, key)
	if c == nil {
		res.Miss = miss
		return nil, res
	}
	defer c.data.Close()
	// The graph is ORT's own optimised one; optimising it again would
	// spend the time the cache saves, and its prepacked weights are
	// taken from the data file as they are.
	if err := so.SetGraphOptimizationLevel(ort.GraphOptimizationLevelDisableAll); err != nil {
		res.Miss = "cannot turn optimisation off: " + err.Error()
		return nil, res
	}
	if err := so.AddSessionConfigEntry(externalFolderKey, c.dir); err != nil {
		res.Miss = "cannot set its data folder: " + err.Error()
		return nil, res
	}
	sess, err := ort.NewDynamicAdvancedSessionWithONNXData(c.graph, m.InputNames, []string{m.OutputName}, so)
	if err != nil {
		res.Miss = "ONNX Runtime refused it: " + err.Error()
		return nil, res
	}
	if !c.unchanged() {
		sess.Destroy()
		res.Miss = "its data file was replaced or written while the session was created"
		return nil, res
	}
	if m.hashDone != nil {
		<-m.hashDone
	}
	m.filesMu.Lock()
	hashed := m.hashed
	m.filesMu.Unlock()
	if hashed != c.man.ModelSHA256 {
		sess.Destroy()
		res.Miss = "written for another version of the model"
		if hashed == "" {
			res.Miss = "the model's version is unknown (its hash failed)"
		}
		return nil, res
	}
	return sess, res
}

// GraphCacheDir is SessionOptions.GraphCache of the session.
func (s *Session) GraphCacheDir() string { return s.opts.GraphCache }

// BuildGraphCache writes the entry that later sessions with the options s
// was created with load instead of optimising the graph and packing its
// weights (SessionOptions.GraphCache), replacing any entry of the same
// model file. It creates one more session for it, on a thread of its own at
// the lowest CPU priority (nice 19) and one intra-op thread, while ORT
// optimises the graph and writes it with its prepacked weights (about the
// model's size twice over on disk, and as much memory again while it runs,
// for seconds to minutes); the entry becomes visible whole, by a rename,
// once written and checked. Call it once the scorer is ready: it is what a
// later start saves, and costs this one nothing it waits for. ctx stops it
// between its steps; ORT's session creation cannot be interrupted.
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
	if err := os.MkdirAll(dir, 0o777); err != nil {
		return fail(err)
	}
	sweepGraphTemp(dir)
	entry := graphCacheEntry(dir, key)
	tmp, err := mkdirTemp(dir, "."+filepath.Base(entry)+"-")
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
	m.filesMu.Unlock()
	if err := m.writeOptimized(tmp, opts); err != nil {
		return fail(err)
	}
	if err := m.checkFiles(); err != nil {
		return fail(err)
	}
	if err := ctx.Err(); err != nil {
		return fail(err)
	}
	man := graphManifest{Format: graphCacheFormat, Key: key, ModelSHA256: m.SHA256, ModelFiles: files, Written: time.Now().UTC()}
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
	if err := os.WriteFile(filepath.Join(tmp, graphCacheManifest), append(b, '\n'), 0o666); err != nil {
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
	removeOtherEntries(dir, entry, files[0].Path)
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

// removeOtherEntries removes the entries in dir other than keep that were
// made from the model file model: one entry per model file, so a cache
// shared by starts with other settings or versions does not grow with
// each (the entry of the settings that ran last is kept).
func removeOtherEntries(dir, keep, model string) {
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
		if len(man.ModelFiles) > 0 && man.ModelFiles[0].Path == model {
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

// mkdirTemp creates a new folder prefix+random+".tmp" in dir at 0777 less
// the umask (os.MkdirTemp fixes 0700), as the calibration caches leave
// who may share the cache to the umask.
func mkdirTemp(dir, prefix string) (string, error) {
	for range 100 {
		name := filepath.Join(dir, prefix+strconv.FormatUint(rand.Uint64(), 36)+".tmp")
		err := os.Mkdir(name, 0o777)
		if !errors.Is(err, fs.ErrExist) {
			return name, err
		}
	}
	return "", fmt.Errorf("%s: no unused temporary name for %s*.tmp", dir, prefix)
}
