package model

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
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
// and no user but its own (or root) can have written it (loadGraphCache,
// untrustedFile): a file cut short, changed, left by another key or
// model version, or another user's to write is refused with the reason,
// and never given to ORT.
const (
	// graphCacheFormat's 2 keys entries by the model's slot
	// (graphCacheSlot) and leaves the thread counts and padding out; a
	// write removes its slot's entries of format 1 (removeOtherEntries).
	graphCacheFormat   = "ort-optimized-prepacked-2"
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
	// ModelSlot is the model's graph file as configured, its links
	// unresolved (graphCacheSlot): what stays the same across the
	// model's versions, so that a write can remove the entries of its
	// earlier ones (removeOtherEntries). Empty in format 1's manifests.
	ModelSlot string `json:"model_slot"`
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
// model's slot and its data files as the graph names them (one entry per
// model slot and settings, replaced when its version changes), the graph
// rewrite, ONNX Runtime's release, the memory pattern and the machine (OS,
// architecture, CPU model and features: MLAS packs weights in the layout
// of the kernels it picks for this CPU). Not the thread counts: the entry
// is written with one intra-op thread whatever the sessions run (neither
// the optimiser nor the packing depends on it), nor padding, which only
// shapes the batches; sessions of pods of two sizes share one entry. ""
// when the session cannot be cached (execution providers added through
// Configure: their graphs and layouts are the device's).
func (s sessionOpts) graphCacheKey(m *Model) string {
	if s.Configure != nil {
		return ""
	}
	var b strings.Builder
	// checkFiles may replace held (the same paths, opened again).
	m.filesMu.Lock()
	fmt.Fprintf(&b, "format=%s model=%q", graphCacheFormat, graphCacheSlot(m.held[0].path))
	for _, h := range m.held[1:] {
		fmt.Fprintf(&b, " data=%q", graphCacheSlot(h.path))
	}
	m.filesMu.Unlock()
	fmt.Fprintf(&b, " max_len=%d rewritten=%t", m.MaxLength, m.relAttn)
	if m.relAttn {
		b.WriteString(" rewrites=" + m.rewrites)
	}
	fmt.Fprintf(&b, " ort=%s mem_pattern=%t", ort.GetVersion(), !s.DisableMemPattern)
	fmt.Fprintf(&b, " os=%s/%s cpu=%q", runtime.GOOS, runtime.GOARCH, ortenv.CPUIdentity())
	return b.String()
}

// graphCacheSlot is the model file at path (absolute, links unresolved:
// the path as configured) as the slot its versions share. Its real path
// is no such thing: a Hugging Face cache links snapshots/<rev>/model.onnx
// to blobs/<sha>, and a volume swapped by a link (git-sync, a ConfigMap's
// ..data, current -> v42/) resolves to another folder at each version. A
// Hugging Face cache's snapshot also names the revision in the path as
// configured (models--<org>--<name>/snapshots/<rev>/...): the revision is
// left out, so that the next revision is the same slot.
func graphCacheSlot(path string) string {
	parts := strings.Split(filepath.ToSlash(path), "/")
	for i := len(parts) - 3; i >= 1; i-- {
		if parts[i] == "snapshots" && strings.HasPrefix(parts[i-1], "models--") {
			parts[i+1] = "*"
			break
		}
	}
	return filepath.FromSlash(strings.Join(parts, "/"))
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

// untrustedFile says why the file or folder at path (st, as stat or fstat
// gave it) may hold what another user wrote, "" when it cannot: it is
// owned by the process's user or root, and neither its group nor others
// may write it. An entry's checksums are its own manifest's, so whoever
// can write the cache folder, the entry's or a file in it decides what
// ONNX Runtime loads, and results would still carry the model's genuine
// version (SessionOptions.GraphCacheTrusted waives the check).
func untrustedFile(path string, st fs.FileInfo) string {
	uid, ok := fileOwner(st)
	if !ok {
		return fmt.Sprintf("cannot tell who owns %s on %s: only a folder set trusted is loaded from here", path, runtime.GOOS)
	}
	if me := os.Geteuid(); uid != uint32(me) && uid != 0 {
		return fmt.Sprintf("%s is owned by uid %d, not by this process's (%d) or root: whoever can write it decides the graph and weights ONNX Runtime runs", path, uid, me)
	}
	if perm := st.Mode().Perm(); perm&0o022 != 0 {
		return fmt.Sprintf("%s is writable by group or others (mode %04o): whoever can write it decides the graph and weights ONNX Runtime runs", path, perm)
	}
	return ""
}

// untrustedPath is untrustedFile of what is at path, links followed;
// exists is false when nothing is.
func untrustedPath(path string) (miss string, exists bool) {
	st, err := os.Stat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return "", false
	}
	if err != nil {
		return "unreadable: " + err.Error(), true
	}
	return untrustedFile(path, st), true
}

// openEntryFile opens the entry's file at path, refusing it (with why)
// unless trusted or untrustedFile passes what was opened.
func openEntryFile(path string, trusted bool) (*os.File, fs.FileInfo, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, err
	}
	st, err := f.Stat()
	if err == nil && !trusted {
		if why := untrustedFile(path, st); why != "" {
			err = untrustedError(why)
		}
	}
	if err != nil {
		f.Close()
		return nil, nil, err
	}
	return f, st, nil
}

// untrustedError is openEntryFile's refusal of a file untrustedFile
// does not pass: the miss is its reason, not a file that is unreadable.
type untrustedError string

func (e untrustedError) Error() string { return string(e) }

// unreadable is the miss of an entry's file that could not be read (what,
// then why), or that untrustedFile refused (why alone).
func unreadable(what string, err error) string {
	var why untrustedError
	if errors.As(err, &why) {
		return string(why)
	}
	return what + ": " + err.Error()
}

// loadGraphCache reads and checks key's entry in dir: "" and the entry,
// or why it cannot be used; unless trusted, the folder, the entry and
// its files must pass untrustedFile. The data file stays open (the
// caller closes it) so that what ORT opens can be compared with what was
// checked.
func (m *Model) loadGraphCache(dir, key string, trusted bool) (*cachedGraph, string) {
	entry := graphCacheEntry(dir, key)
	if !trusted {
		for _, p := range []string{dir, entry} {
			switch why, exists := untrustedPath(p); {
			case !exists:
				return nil, "none kept"
			case why != "":
				return nil, why
			}
		}
	}
	f, _, err := openEntryFile(filepath.Join(entry, graphCacheManifest), trusted)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, "none kept"
	}
	if err != nil {
		return nil, unreadable("unreadable", err)
	}
	b, err := readAllLimited(f, 1<<20)
	f.Close()
	if err != nil {
		return nil, unreadable("unreadable", err)
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
	f, _, err = openEntryFile(filepath.Join(entry, graphCacheGraph), trusted)
	if err != nil {
		return nil, unreadable("unreadable graph", err)
	}
	graph, err := readAllLimited(f, man.GraphBytes+1)
	f.Close()
	if err != nil {
		return nil, unreadable("unreadable graph", err)
	}
	if sum := sha256.Sum256(graph); int64(len(graph)) != man.GraphBytes || hex.EncodeToString(sum[:]) != man.GraphSHA {
		return nil, fmt.Sprintf("the graph file is damaged (%d bytes, manifest says %d, or another checksum)", len(graph), man.GraphBytes)
	}
	f, st, err := openEntryFile(filepath.Join(entry, graphCacheData), trusted)
	if err != nil {
		return nil, unreadable("unreadable data", err)
	}
	if st.Size() != man.DataBytes {
		f.Close()
		return nil, fmt.Sprintf("the data file has %d bytes, the manifest says %d", st.Size(), man.DataBytes)
	}
	sum, err := crcOf(f)
	if err != nil {
		f.Close()
		return nil, unreadable("unreadable data", err)
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
	return readAllLimited(f, limit)
}

// readAllLimited reads f from where it is to its end, failing past limit
// bytes.
func readAllLimited(f *os.File, limit int64) ([]byte, error) {
	b, err := io.ReadAll(io.LimitReader(f, limit))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) >= limit {
		return nil, fmt.Errorf("%s: larger than %d bytes", f.Name(), limit-1)
	}
	return b, nil
}

// newCachedSession creates the session from key's entry in
// opts.GraphCache, or says why it did not. It waits for the model's hash
// (computed beside session creation, and done before it on a
// production-size model) to check the entry's version, and discards a
// session whose entry was not the model's version or changed while ORT
// read it.
func (m *Model) newCachedSession(opts SessionOptions, key string, so *ort.SessionOptions) (*ort.DynamicAdvancedSession, GraphCacheResult) {
	res := GraphCacheResult{Path: graphCacheEntry(opts.GraphCache, key)}
	c, miss := m.loadGraphCache(opts.GraphCache, key, opts.GraphCacheTrusted)
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
