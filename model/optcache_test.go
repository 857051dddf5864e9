package model

import (
	"context"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/scorer/scorer/internal/testenv"
	"github.com/scorer/scorer/model/onnxpb"
)

// graphCacheModel loads a copy of the tiny DeBERTa-v3 whose graph file is
// a file of the test's own (the other files are links), so a test may
// change it.
func graphCacheModel(t *testing.T) (*Model, string) {
	t.Helper()
	src := testenv.ModelDir(t, "nli-deberta-v3-tiny")
	dir := copyModelDir(t, src, nil, "model.onnx")
	b, err := os.ReadFile(filepath.Join(src, "model.onnx"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "model.onnx"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	return loadModel(t, LoadOptions{Dir: dir}), dir
}

// cacheSession is a session of m with one intra-op thread (threads more
// when said) and the graph cache in dir.
func cacheSession(t *testing.T, m *Model, dir string, threads ...int) *Session {
	t.Helper()
	n := 1
	if len(threads) > 0 {
		n = threads[0]
	}
	s, err := m.NewSession(SessionOptions{IntraOpThreads: n, GraphCache: dir})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// cacheSessionOpts is a session of m with opts.
func cacheSessionOpts(t *testing.T, m *Model, opts SessionOptions) *Session {
	t.Helper()
	s, err := m.NewSession(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// maxLogitDiff is the largest difference between a's and b's logits on
// pairs.
func maxLogitDiff(t *testing.T, a, b *Session, pairs []Pair) float64 {
	t.Helper()
	la, err := a.Logits(context.Background(), pairs)
	if err != nil {
		t.Fatal(err)
	}
	lb, err := b.Logits(context.Background(), pairs)
	if err != nil {
		t.Fatal(err)
	}
	d := 0.0
	for i := range la {
		for j := range la[i] {
			d = max(d, math.Abs(float64(la[i][j]-lb[i][j])))
		}
	}
	return d
}

// buildCache writes s's graph cache entry or fails the test.
// rebuiltAfterRefusal checks what follows an entry the cache refused: s,
// the session that refused it, scores as plain does, a build writes the
// entry again where it was, and the next session loads it.
func rebuiltAfterRefusal(t *testing.T, m *Model, dir, entry string, plain, s *Session, pairs []Pair) {
	t.Helper()
	if d := maxLogitDiff(t, plain, s, pairs); d > 1e-6 {
		t.Errorf("session after the refused entry differs from the plain one by %g", d)
	}
	if again := buildCache(t, s); again != entry {
		t.Fatalf("rebuilt at %s, want %s", again, entry)
	}
	if r := cacheSession(t, m, dir).GraphCache(); !r.Hit() {
		t.Errorf("session after the rebuild: %+v, want loaded from the cache", r)
	}
}

func buildCache(t *testing.T, s *Session) string {
	t.Helper()
	entry, err := s.BuildGraphCache(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return entry
}

// A session loaded from the graph cache runs ONNX Runtime's optimised
// graph with its prepacked weights as written by an earlier session, and
// scores as a session created without the cache does; creating a session
// writes nothing (the entry is written by BuildGraphCache, after start).
func TestGraphCacheSameLogits(t *testing.T) {
	m, _ := graphCacheModel(t)
	dir := filepath.Join(t.TempDir(), "graph-cache")
	plain := cacheSession(t, m, "")
	if r := plain.GraphCache(); r.Path != "" || r.Hit() {
		t.Errorf("session without GraphCache: %+v, want no cache", r)
	}
	first := cacheSession(t, m, dir)
	if r := first.GraphCache(); r.Hit() || r.Miss != "none kept" {
		t.Fatalf("first session: %+v, want a miss, none kept", r)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("creating a session wrote the cache folder (%v): it is written after start, by BuildGraphCache", err)
	}
	entry := buildCache(t, first)
	for _, f := range []string{graphCacheGraph, graphCacheData, graphCacheManifest} {
		if _, err := os.Stat(filepath.Join(entry, f)); err != nil {
			t.Errorf("entry lacks %s: %v", f, err)
		}
	}
	cached := cacheSession(t, m, dir)
	if r := cached.GraphCache(); !r.Hit() || r.Path != entry {
		t.Fatalf("second session: %+v, want loaded from %s", r, entry)
	}
	if d := maxLogitDiff(t, plain, cached, externalPairs(t, m)); d > 1e-6 {
		t.Errorf("logits from the cached graph differ from the plain session's by %g, want <= 1e-6", d)
	}
}

// An entry that is damaged (cut short, bytes changed), whose manifest is
// not JSON, or that was written under another key is refused with the
// reason, before ONNX Runtime reads it: the session is created from the
// model as without a cache, and scores as such. Writing the cache again
// replaces the entry, which the next session loads.
func TestGraphCacheRefusesDamagedEntries(t *testing.T) {
	m, _ := graphCacheModel(t)
	plain := cacheSession(t, m, "")
	pairs := externalPairs(t, m)
	for _, tc := range []struct {
		name   string
		damage func(t *testing.T, dir, entry string)
		miss   string
	}{
		{"data changed in place", func(t *testing.T, _, entry string) {
			testenv.FlipInPlace(t, filepath.Join(entry, graphCacheData))
		}, "data file is damaged"},
		{"data cut short", func(t *testing.T, _, entry string) {
			p := filepath.Join(entry, graphCacheData)
			st, err := os.Stat(p)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.Truncate(p, st.Size()/2); err != nil {
				t.Fatal(err)
			}
		}, "the manifest says"},
		{"graph changed in place", func(t *testing.T, _, entry string) {
			testenv.FlipInPlace(t, filepath.Join(entry, graphCacheGraph))
		}, "graph file is damaged"},
		{"manifest not JSON", func(t *testing.T, _, entry string) {
			if err := os.WriteFile(filepath.Join(entry, graphCacheManifest), []byte("{\"format\":"), 0o644); err != nil {
				t.Fatal(err)
			}
		}, "corrupt manifest"},
		{"entry of another key", func(t *testing.T, dir, entry string) {
			// The entry of sessions without memory patterns, put where
			// the other sessions' entry is.
			other := buildCache(t, cacheSessionOpts(t, m, SessionOptions{IntraOpThreads: 1, DisableMemPattern: true, GraphCache: dir}))
			if err := os.RemoveAll(entry); err != nil {
				t.Fatal(err)
			}
			if err := os.Rename(other, entry); err != nil {
				t.Fatal(err)
			}
		}, "kept for another key"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			entry := buildCache(t, cacheSession(t, m, dir))
			tc.damage(t, dir, entry)
			s := cacheSession(t, m, dir)
			if r := s.GraphCache(); r.Hit() || !strings.Contains(r.Miss, tc.miss) {
				t.Fatalf("session on the damaged entry: %+v, want a miss saying %q", r, tc.miss)
			}
			rebuiltAfterRefusal(t, m, dir, entry, plain, s, pairs)
		})
	}
}

// An entry is the model version's it was written from: a model file
// touched since (another modification time) is not loaded, and one whose
// bytes changed while its size and modification time did not (written
// and its time set back) is found by the version check once the model's
// hash is known, and the session loaded from the entry is dropped.
func TestGraphCacheOtherModelVersion(t *testing.T) {
	m, modelDir := graphCacheModel(t)
	dir := t.TempDir()
	buildCache(t, cacheSession(t, m, dir))
	path := filepath.Join(modelDir, "model.onnx")
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}

	later := st.ModTime().Add(time.Second)
	if err := os.Chtimes(path, later, later); err != nil {
		t.Fatal(err)
	}
	touched := loadModel(t, LoadOptions{Dir: modelDir})
	if r := cacheSession(t, touched, dir).GraphCache(); r.Hit() || !strings.Contains(r.Miss, "files changed") {
		t.Errorf("model file touched: %+v, want a miss saying its files changed", r)
	}

	// One weight's bytes changed, in place, and the time set back.
	changeWeight(t, m, path)
	if err := os.Chtimes(path, st.ModTime(), st.ModTime()); err != nil {
		t.Fatal(err)
	}
	changed := loadModel(t, LoadOptions{Dir: modelDir})
	if changed.SHA256 == m.SHA256 {
		t.Fatal("the changed model hashes as the original")
	}
	if r := cacheSession(t, changed, dir).GraphCache(); r.Hit() || !strings.Contains(r.Miss, "another version") {
		t.Errorf("model bytes changed under the same size and time: %+v, want a miss naming another version", r)
	}
}

// changeWeight writes other bytes into one of m's weights in its graph
// file at path, in place: another version of the model, as valid as m.
func changeWeight(t *testing.T, m *Model, path string) {
	t.Helper()
	var g onnxpb.ModelProto
	if err := proto.Unmarshal(m.graph, &g); err != nil {
		t.Fatal(err)
	}
	var off, n int64 = -1, 0
	for _, init := range g.GetGraph().GetInitializer() {
		if init.GetDataLocation() == onnxpb.TensorProto_EXTERNAL {
			_, off, n, _ = externalRef(init)
			break
		}
	}
	if off < 0 || n < 8 {
		t.Fatal("the tiny model has no weight stored apart from its graph")
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte{0x7f, 0x7f, 0x7f, 0x7f}, off+n/2&^3); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}

// cacheEntries are the names in the cache folder dir.
func cacheEntries(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}

// relink points the link at path to target, as git-sync swaps its link or
// a Hugging Face cache moves snapshots/<rev> to a new blob: a new link
// renamed over the old one.
func relink(t *testing.T, target, path string) {
	t.Helper()
	tmp := path + ".new"
	if err := os.Symlink(target, tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// A model slot is its graph file as configured, links unresolved: in a
// Hugging Face cache (snapshots/<rev>/model.onnx -> blobs/<sha>) or a
// volume whose folder link is swapped (git-sync's ..data, current -> v42/)
// each version of the model has a real path of its own. Writing the entry
// of a new version removes the slot's entries of earlier versions,
// whichever settings wrote them; the entries of other settings for the
// same version, and those of another model in the same folder, stay.
func TestGraphCacheOneEntryPerModelVersion(t *testing.T) {
	src := testenv.ModelDir(t, "nli-deberta-v3-tiny")
	b, err := os.ReadFile(filepath.Join(src, "model.onnx"))
	if err != nil {
		t.Fatal(err)
	}
	blobs := t.TempDir()
	blobA, blobB := filepath.Join(blobs, "a"), filepath.Join(blobs, "b")
	for _, p := range []string{blobA, blobB} {
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	modelDir := copyModelDir(t, src, nil, "model.onnx")
	path := filepath.Join(modelDir, "model.onnx")
	if err := os.Symlink(blobA, path); err != nil {
		t.Fatal(err)
	}
	a := loadModel(t, LoadOptions{Dir: modelDir})
	changeWeight(t, a, blobB)

	dir := t.TempDir()
	buildCache(t, cacheSession(t, a, dir))
	buildCache(t, cacheSessionOpts(t, a, SessionOptions{IntraOpThreads: 1, DisableMemPattern: true, GraphCache: dir}))
	other, _ := graphCacheModel(t)
	otherEntry := buildCache(t, cacheSession(t, other, dir))
	if len(cacheEntries(t, dir)) != 3 {
		t.Errorf("cache folder holds %v, want the entries of two settings and of another model", cacheEntries(t, dir))
	}

	relink(t, blobB, path)
	bModel := loadModel(t, LoadOptions{Dir: modelDir})
	if bModel.SHA256 == a.SHA256 {
		t.Fatal("blob b hashes as blob a")
	}
	s := cacheSession(t, bModel, dir)
	if r := s.GraphCache(); r.Hit() {
		t.Fatalf("session of the new version: %+v, want a miss", r)
	}
	newEntry := buildCache(t, s)
	want := []string{filepath.Base(newEntry), filepath.Base(otherEntry)}
	slices.Sort(want)
	if got := cacheEntries(t, dir); !slices.Equal(got, want) {
		t.Errorf("after the new version's entry, the cache folder holds %v, want %v (the new version's and the other model's)", got, want)
	}
	if r := cacheSession(t, bModel, dir).GraphCache(); !r.Hit() {
		t.Errorf("session after the new version's entry: %+v, want loaded from it", r)
	}
	if r := cacheSession(t, other, dir).GraphCache(); !r.Hit() {
		t.Errorf("the other model's session: %+v, want loaded from its entry, kept", r)
	}
}

// The session settings that do not change ORT's optimised graph or its
// packed weights (the thread counts: the entry is written with one
// intra-op thread whatever the sessions run; padding, which is the
// batches') share one entry: pods of two sizes on one volume load each
// other's entry rather than replace it at every start.
func TestGraphCacheSharedAcrossThreadsAndPadding(t *testing.T) {
	m, _ := graphCacheModel(t)
	dir := t.TempDir()
	entry := buildCache(t, cacheSession(t, m, dir, 2))
	for _, opts := range []SessionOptions{
		{IntraOpThreads: 4},
		{IntraOpThreads: 1, InterOpThreads: 2},
		{IntraOpThreads: 2, PadToMultipleOf: 8},
	} {
		opts.GraphCache = dir
		if r := cacheSessionOpts(t, m, opts).GraphCache(); !r.Hit() || r.Path != entry {
			t.Errorf("session with %d intra-op, %d inter-op threads, padding to %d: %+v, want loaded from %s",
				opts.IntraOpThreads, opts.InterOpThreads, opts.PadToMultipleOf, r, entry)
		}
	}
	if got := cacheEntries(t, dir); len(got) != 1 {
		t.Errorf("cache folder holds %v, want one entry", got)
	}
}

// A write removes the temporary folders of writers that are gone (a
// process that exited before its entry was written holds no lock on its
// folder), but not one being written now.
func TestGraphCacheSweepsDeadWriters(t *testing.T) {
	m, _ := graphCacheModel(t)
	dir := t.TempDir()
	gone := filepath.Join(dir, ".graph-gone-1.tmp")
	live := filepath.Join(dir, ".graph-live-2.tmp")
	for _, p := range []string{gone, live} {
		if err := os.Mkdir(p, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(gone, graphCacheData), make([]byte, 4096), 0o644); err != nil {
		t.Fatal(err)
	}
	lock, ok := lockDir(live)
	if !ok {
		t.Fatal("cannot lock a fresh folder")
	}
	defer lock.Close()
	entry := buildCache(t, cacheSession(t, m, dir))
	want := []string{filepath.Base(live), filepath.Base(entry)}
	if got := cacheEntries(t, dir); !slices.Equal(got, want) {
		t.Errorf("cache folder holds %v, want %v", got, want)
	}
	b, err := os.ReadFile(filepath.Join(entry, graphCacheManifest))
	if err != nil {
		t.Fatal(err)
	}
	var man graphManifest
	if err := json.Unmarshal(b, &man); err != nil {
		t.Fatal(err)
	}
	if man.ModelSHA256 != m.SHA256 {
		t.Errorf("manifest: version %s, want %s", man.ModelSHA256, m.SHA256)
	}
}

// A Hugging Face cache names the revision in the folder configured
// (models--<org>--<name>/snapshots/<rev>/), and each revision's files link
// to blobs of their own: the next revision's entry replaces the last
// one's all the same, and another model in the same hub keeps its entry.
func TestGraphCacheHuggingFaceRevisions(t *testing.T) {
	src := testenv.ModelDir(t, "nli-deberta-v3-tiny")
	hub := t.TempDir()
	snapshot := func(repo, rev string, change *Model) (string, *Model) {
		t.Helper()
		blobs := filepath.Join(hub, repo, "blobs")
		dir := filepath.Join(hub, repo, "snapshots", rev)
		for _, d := range []string{blobs, dir} {
			if err := os.MkdirAll(d, 0o755); err != nil {
				t.Fatal(err)
			}
		}
		entries, err := os.ReadDir(src)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			if e.IsDir() {
				continue
			}
			b, err := os.ReadFile(filepath.Join(src, e.Name()))
			if err != nil {
				t.Fatal(err)
			}
			blob := filepath.Join(blobs, rev+"-"+e.Name())
			if err := os.WriteFile(blob, b, 0o644); err != nil {
				t.Fatal(err)
			}
			if e.Name() == "model.onnx" && change != nil {
				changeWeight(t, change, blob)
			}
			if err := os.Symlink(filepath.Join("..", "..", "blobs", filepath.Base(blob)), filepath.Join(dir, e.Name())); err != nil {
				t.Fatal(err)
			}
		}
		return dir, loadModel(t, LoadOptions{Dir: dir})
	}
	cache := t.TempDir()
	_, one := snapshot("models--org--tiny", "1111", nil)
	buildCache(t, cacheSession(t, one, cache))
	_, other := snapshot("models--org--other", "1111", nil)
	otherEntry := buildCache(t, cacheSession(t, other, cache))
	_, two := snapshot("models--org--tiny", "2222", one)
	if two.SHA256 == one.SHA256 {
		t.Fatal("revision 2222 hashes as 1111")
	}
	entry := buildCache(t, cacheSession(t, two, cache))
	want := []string{filepath.Base(entry), filepath.Base(otherEntry)}
	slices.Sort(want)
	if got := cacheEntries(t, cache); !slices.Equal(got, want) {
		t.Errorf("after revision 2222's entry, the cache folder holds %v, want %v (its entry and the other model's)", got, want)
	}
	if r := cacheSession(t, other, cache).GraphCache(); !r.Hit() {
		t.Errorf("the other model's session: %+v, want loaded from its entry, kept", r)
	}
}

// An entry's checksums are its own manifest's: whoever could write the
// entry could give ONNX Runtime any graph and weights under the model's
// real version. A start therefore loads only an entry that no user but
// the process's own (or root) can have written: the cache folder, the
// entry's folder and each of its files owned by the process's user or
// root and writable by neither group nor others. Any other is a miss
// naming why; the session is created from the model, and writing the
// entry again replaces it with one that loads.
func TestGraphCacheRefusesEntriesOthersCanWrite(t *testing.T) {
	m, _ := graphCacheModel(t)
	plain := cacheSession(t, m, "")
	pairs := externalPairs(t, m)
	chown := func(name string) func(t *testing.T, entry string) {
		return func(t *testing.T, entry string) {
			if os.Geteuid() != 0 {
				// Giving a file to another user takes root; a user
				// namespace (unshare -r) maps only our own uid, so
				// there is no other to give it to.
				t.Skip("not root: cannot give a file to another user")
			}
			if err := os.Chown(filepath.Join(entry, name), 65534, 65534); err != nil {
				t.Fatal(err)
			}
		}
	}
	chmod := func(name string, mode os.FileMode) func(t *testing.T, entry string) {
		return func(t *testing.T, entry string) {
			if err := os.Chmod(filepath.Join(entry, name), mode); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, tc := range []struct {
		name  string
		alter func(t *testing.T, entry string)
		miss  string
	}{
		{"entry folder writable by all", chmod(".", 0o777), "writable by group or others"},
		{"entry folder writable by its group", chmod(".", 0o775), "writable by group or others"},
		{"data writable by its group", chmod(graphCacheData, 0o664), "writable by group or others"},
		{"graph writable by all", chmod(graphCacheGraph, 0o666), "writable by group or others"},
		{"manifest writable by all", chmod(graphCacheManifest, 0o666), "writable by group or others"},
		{"manifest of another user", chown(graphCacheManifest), "owned by uid 65534"},
		{"graph of another user", chown(graphCacheGraph), "owned by uid 65534"},
		{"data of another user", chown(graphCacheData), "owned by uid 65534"},
		{"entry folder of another user", chown("."), "owned by uid 65534"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			entry := buildCache(t, cacheSession(t, m, dir))
			tc.alter(t, entry)
			s := cacheSession(t, m, dir)
			if r := s.GraphCache(); r.Hit() || !strings.Contains(r.Miss, tc.miss) || strings.HasPrefix(r.Miss, "unreadable") {
				t.Fatalf("session on the altered entry: %+v, want a miss saying %q", r, tc.miss)
			}
			rebuiltAfterRefusal(t, m, dir, entry, plain, s, pairs)
		})
	}
}

// A cache folder others can write is refused as a whole: no entry in it
// is loaded, and none is written (a start could not load it).
func TestGraphCacheRefusesFolderOthersCanWrite(t *testing.T) {
	m, _ := graphCacheModel(t)
	dir := t.TempDir()
	entry := buildCache(t, cacheSession(t, m, dir))
	if err := os.Chmod(dir, 0o775); err != nil {
		t.Fatal(err)
	}
	s := cacheSession(t, m, dir)
	if r := s.GraphCache(); r.Hit() || !strings.Contains(r.Miss, dir+" is writable by group or others") {
		t.Fatalf("session in a folder its group can write: %+v, want a miss naming the folder", r)
	}
	if err := os.RemoveAll(entry); err != nil {
		t.Fatal(err)
	}
	if got, err := s.BuildGraphCache(context.Background()); err == nil || !strings.Contains(err.Error(), "writable by group or others") {
		t.Errorf("writing the entry in a folder its group can write: %q, %v; want an error saying so", got, err)
	}
	if got := cacheEntries(t, dir); len(got) != 0 {
		t.Errorf("cache folder holds %v, want nothing written", got)
	}
}

// The cache's folders and files are written writable by their owner only,
// whatever the umask (002 here, as docs/operating.md once advised for the
// calibration caches beside it): a start refuses any other.
func TestGraphCacheWritesOwnerOnlyModes(t *testing.T) {
	m, _ := graphCacheModel(t)
	old := syscall.Umask(0o002)
	defer syscall.Umask(old)
	dir := filepath.Join(t.TempDir(), "parent", "graph-cache")
	entry := buildCache(t, cacheSession(t, m, dir))
	for _, p := range []string{filepath.Dir(dir), dir, entry, filepath.Join(entry, graphCacheGraph),
		filepath.Join(entry, graphCacheData), filepath.Join(entry, graphCacheManifest)} {
		st, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode().Perm()&0o022 != 0 {
			t.Errorf("%s: mode %04o, want writable by its owner only", p, st.Mode().Perm())
		}
	}
	if r := cacheSession(t, m, dir).GraphCache(); !r.Hit() {
		t.Errorf("session on the entry written under umask 002: %+v, want loaded from it", r)
	}
}

// A folder said to be trusted (GRAPH_CACHE_TRUSTED: pods of several users
// sharing a volume through a group) is loaded from whoever wrote it, and
// written at the modes the umask leaves, so that the group can replace
// what is there.
func TestGraphCacheTrustedFolder(t *testing.T) {
	m, _ := graphCacheModel(t)
	old := syscall.Umask(0o002)
	defer syscall.Umask(old)
	dir := filepath.Join(t.TempDir(), "graph-cache")
	trusted := SessionOptions{IntraOpThreads: 1, GraphCache: dir, GraphCacheTrusted: true}
	entry := buildCache(t, cacheSessionOpts(t, m, trusted))
	for _, p := range []string{dir, entry, filepath.Join(entry, graphCacheManifest)} {
		if st, err := os.Stat(p); err != nil || st.Mode().Perm()&0o020 == 0 {
			t.Errorf("%s in a trusted folder under umask 002: %v, %v; want writable by its group", p, st.Mode(), err)
		}
	}
	if r := cacheSession(t, m, dir).GraphCache(); r.Hit() || !strings.Contains(r.Miss, "writable by group or others") {
		t.Errorf("session not trusting the folder: %+v, want a miss saying its group can write it", r)
	}
	if r := cacheSessionOpts(t, m, trusted).GraphCache(); !r.Hit() {
		t.Errorf("session trusting the folder: %+v, want loaded from it", r)
	}
}
