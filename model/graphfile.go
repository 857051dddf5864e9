package model

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"google.golang.org/protobuf/proto"

	"github.com/scorer/scorer/model/onnxgraph"
	"github.com/scorer/scorer/model/onnxpb"
)

// leanGraph is a graph file as sessions load it: the model with every large
// initializer's data left on disk and referenced as ONNX external data
// (location, offset, length) relative to the graph's folder, whether the
// export kept the weights inline (the reference then points into the graph
// file itself) or in external data files (their references are kept).
//
// Why: ORT maps external data instead of reading it into the protobuf it
// parses, so a session is created from a graph of a few MB and mapped
// weights, about half the time and half the peak memory of the same graph
// inline (docs/benchmarks.md, "Peak RSS"), and a rewritten graph needs no
// copy of the weights: sessions load it from memory with the original
// folder as the external data's base (Model.NewSession).
type leanGraph struct {
	m *onnxpb.ModelProto
	// dir is the folder the external locations in m are relative to: the
	// deepest folder holding the graph file and every data file, each with
	// its links resolved (dir itself has none).
	dir string
	// files are the external data files the graph references, as paths in
	// the graph's folder, sorted; the graph file itself is not among them.
	files []string
	// held are the graph file and the data files, open since they were
	// read and checked, the graph file first: Load hashes the bytes it
	// read (hashModel), and NewSession tells a file written in place or
	// renamed over since then from the file that was read
	// (Model.checkFiles). close releases them.
	held []heldFile
}

// heldFile is a model file open since the graph was read.
type heldFile struct {
	// path is the file as the graph names it (its folder joined with the
	// location); real is the same with its links resolved, the path
	// sessions open (leanGraph.dir and the locations are made of it).
	path, real string
	f          *os.File
	// stamp is the file's size, modification and status-change times when
	// it was opened: what a write in place changes (Model.checkFiles).
	stamp fileStamp
}

// fileStamp is what tells a file written since it was read: its size,
// modification time and status-change time (ctime).
//
// Why the ctime: every write sets the mtime to the time of the write, but
// user space can set it back, and tools do: `rsync --inplace -t`, `cp -p`
// from artifacts with normalised timestamps (Bazel, ko, nix), `touch -r`
// give a file new bytes with its old size and mtime. The kernel sets the
// ctime on every write and on every change of the mtime, and nothing sets
// it back. It also moves on changes that leave the bytes alone (chmod,
// chown, a link added or removed): Model.checkFiles then hashes the files
// again and holds them as they are, so such a change costs one hash,
// never a refusal.
type fileStamp struct {
	size  int64
	mtime int64 // ns since the epoch
	ctime int64 // ns since the epoch; 0 where not read (filestamp_other.go)
}

func stampOf(st os.FileInfo) fileStamp {
	return fileStamp{size: st.Size(), mtime: st.ModTime().UnixNano(), ctime: ctimeOf(st)}
}

// close closes the files lg holds open.
func (lg *leanGraph) close() {
	closeHeld(lg.held)
	lg.held = nil
}

// ErrExternalData is the error of a graph whose external data cannot be
// read: a location outside the model folder, a missing file, a range past
// a file's end.
var ErrExternalData = errors.New("external data")

// locate checks the external data references of the graph's
// initializers (read from the graph file at path), records the files they
// name and re-bases every location on the folder of their resolved paths.
//
// Why re-base: ORT takes locations relative to a base folder and refuses
// any whose path, links resolved, leaves it. A model folder of links (a
// Hugging Face cache snapshot, a Kubernetes volume) points elsewhere by
// design, and the references into the graph file itself that
// readLeanGraph makes would leave any folder of the graph's links. The
// user's locations are checked lexically against the graph's folder first,
// so a graph cannot name a file outside what the folder holds or links to.
//
// Why check here and not leave it to ORT: ORT reports a bad location deep
// in session creation, once per device, after the model has been hashed;
// users get one line naming the tensor and the file.
func (lg *leanGraph) locate(path string) error {
	path, err := filepath.Abs(path)
	if err != nil {
		return err
	}
	graphDir, self := filepath.Dir(path), filepath.Base(path)
	// The graph file, open since readLeanGraph read it.
	if lg.held[0].real, err = filepath.EvalSymlinks(path); err != nil {
		return err
	}
	lg.held[0].path = path
	files := map[string]int{} // location -> index in lg.held
	var tensors []*onnxpb.TensorProto
	for _, t := range lg.m.GetGraph().GetInitializer() {
		if t.GetDataLocation() != onnxpb.TensorProto_EXTERNAL {
			continue
		}
		tensors = append(tensors, t)
		loc, off, n, err := externalRef(t)
		if err != nil {
			return fmt.Errorf("%w: initializer %s: %w", ErrExternalData, t.GetName(), err)
		}
		if !filepath.IsLocal(loc) {
			return fmt.Errorf("%w: initializer %s: location %q is not a path inside the graph's folder %s", ErrExternalData, t.GetName(), loc, graphDir)
		}
		i, ok := files[loc]
		if !ok && loc == self {
			// readLeanGraph's own references, into the file it read.
			i, ok = 0, true
			files[loc] = i
		}
		if !ok {
			h, err := openHeld(filepath.Join(graphDir, loc))
			if err != nil {
				return fmt.Errorf("%w: initializer %s: %w", ErrExternalData, t.GetName(), err)
			}
			i = len(lg.held)
			lg.held = append(lg.held, h)
			files[loc] = i
		}
		// off and n are not negative (externalRef), but off+n may overflow:
		// compare within the file.
		size := lg.held[i].stamp.size
		if off > size || n > size-off {
			what := fmt.Sprintf("%d bytes from offset %d", n, off)
			if n < 0 {
				what = fmt.Sprintf("offset %d", off)
			}
			return fmt.Errorf("%w: initializer %s: %s of %s, which has %d bytes", ErrExternalData, t.GetName(), what, lg.held[i].path, size)
		}
		if n < 0 {
			n = size - off
		}
		// Every reference now names its bytes in full (ONNX allows the
		// length left out, to the file's end), so readers of lg need not
		// look at the file.
		t.ExternalData = externalEntries(loc, off, n)
	}
	var reals []string
	for loc, i := range files {
		reals = append(reals, lg.held[i].real)
		if loc != self {
			lg.files = append(lg.files, lg.held[i].path)
		}
	}
	slices.Sort(lg.files)
	lg.dir = commonDir(reals)
	if lg.dir == "" {
		// No external data: the base is unused, but a folder ORT can check.
		lg.dir = filepath.Dir(lg.held[0].real)
	}
	for _, t := range tensors {
		loc := t.GetExternalData()[0] // externalEntries' order
		rel, err := filepath.Rel(lg.dir, lg.held[files[loc.GetValue()]].real)
		if err != nil {
			return err
		}
		loc.Value = proto.String(rel)
	}
	return nil
}

// openHeld opens the model file at path for a leanGraph to hold.
func openHeld(path string) (heldFile, error) {
	real, err := filepath.EvalSymlinks(path)
	if err != nil {
		return heldFile{}, err
	}
	f, err := os.Open(real)
	if err != nil {
		return heldFile{}, err
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return heldFile{}, err
	}
	return heldFile{path: path, real: real, f: f, stamp: stampOf(st)}, nil
}

// externalRef reads an external tensor's reference: its location, offset
// (0 when absent) and length (-1 when absent: to the file's end). A
// negative offset or length is an error: ONNX defines neither, and an
// explicit -1 would otherwise read as no length.
func externalRef(t *onnxpb.TensorProto) (loc string, off, n int64, err error) {
	n = -1
	for _, kv := range t.GetExternalData() {
		var v int64
		switch kv.GetKey() {
		case "location":
			loc = kv.GetValue()
		case "offset":
			v, err = strconv.ParseInt(kv.GetValue(), 10, 64)
			off = v
		case "length":
			v, err = strconv.ParseInt(kv.GetValue(), 10, 64)
			n = v
		}
		if err != nil || v < 0 {
			return "", 0, 0, fmt.Errorf("bad %s %q", kv.GetKey(), kv.GetValue())
		}
	}
	return loc, off, n, nil
}

// externalEntries is an external tensor's reference, location first.
func externalEntries(loc string, off, n int64) []*onnxpb.StringStringEntryProto {
	return []*onnxpb.StringStringEntryProto{
		{Key: proto.String("location"), Value: proto.String(loc)},
		{Key: proto.String("offset"), Value: proto.String(strconv.FormatInt(off, 10))},
		{Key: proto.String("length"), Value: proto.String(strconv.FormatInt(n, 10))},
	}
}

// commonDir is the deepest folder holding every one of the absolute,
// clean paths; "" for none.
func commonDir(paths []string) string {
	if len(paths) == 0 {
		return ""
	}
	dir := filepath.Dir(paths[0])
	for _, p := range paths[1:] {
		for dir != "/" && !strings.HasPrefix(p, dir+string(filepath.Separator)) {
			dir = filepath.Dir(dir)
		}
	}
	return dir
}

// RelAttentionNodes names the nodes of the graph at path that the
// relative-attention rewrite replaces or leaves unused (the Tiles, the
// [rows·heads, L, 512] products, the index Expands, the GatherElements and
// what only they read), for profiles that compare the relative-position
// path's cost before and after; the nodes the rewrite adds are named with
// the prefix it returns. It is onnxgraph.ErrNoRelAttention's error for a
// graph the rewrite does not recognise.
func RelAttentionNodes(path string) (removed []string, addedPrefix string, err error) {
	lg, err := readLeanGraph(path)
	if err != nil {
		return nil, "", err
	}
	return onnxgraph.RelAttentionNodes(lg.m)
}

// WriteExternalData writes the graph at path to dst with its large
// initializers' data in dst+"_data" (model.onnx_data for model.onnx), each
// at an offset aligned to 4 KiB, as onnx.save_model with
// save_as_external_data does: the form torch.onnx and Optimum give models
// over 2 GB. The weights are copied file to file, never held in memory.
// make bench measures start-up on both forms of the production stand-in.
func WriteExternalData(path, dst string) error {
	lg, err := openLeanGraph(path)
	if err != nil {
		return fmt.Errorf("model: reading %s: %w", path, err)
	}
	defer lg.close()
	data := filepath.Base(dst) + "_data"
	out, err := os.Create(filepath.Join(filepath.Dir(dst), data))
	if err != nil {
		return err
	}
	defer out.Close()
	// The files the graph was read from, whatever their paths name now.
	srcs := map[string]*os.File{}
	for _, h := range lg.held {
		srcs[h.real] = h.f
	}
	var at int64
	for _, t := range lg.m.GetGraph().GetInitializer() {
		if t.GetDataLocation() != onnxpb.TensorProto_EXTERNAL {
			continue
		}
		rel, off, n, err := externalRef(t) // readLeanGraph checked it and set n
		if err != nil {
			return fmt.Errorf("model: initializer %s: %w", t.GetName(), err)
		}
		src, ok := srcs[filepath.Join(lg.dir, rel)]
		if !ok {
			return fmt.Errorf("model: initializer %s: %s is not a file the graph was read with", t.GetName(), rel)
		}
		at = (at + 4095) &^ 4095
		if _, err := io.Copy(io.NewOffsetWriter(out, at), io.NewSectionReader(src, off, n)); err != nil {
			return fmt.Errorf("model: copying initializer %s: %w", t.GetName(), err)
		}
		t.ExternalData = externalEntries(data, at, n)
		at += n
	}
	b, err := proto.Marshal(lg.m)
	if err != nil {
		return err
	}
	if err := out.Close(); err != nil {
		return err
	}
	return os.WriteFile(dst, b, 0o644)
}
