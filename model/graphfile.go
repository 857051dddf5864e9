package model

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"slices"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/scorer/scorer/model/onnxpb"
)

// smallInitializer is the largest initializer, in encoded bytes, that a
// graph rewrite decodes; larger ones (the weights) are copied through as
// bytes, never decoded, so rewriting a 1.7 GB graph holds only its nodes
// and small constants in memory.
const smallInitializer = 16 << 10

// splitGraph is an ONNX file read for rewriting: the model with its graph's
// nodes and small initializers decoded, and the file ranges of the large
// initializers (TensorProto messages), which stay on disk.
type splitGraph struct {
	m     *onnxpb.ModelProto
	large []pbMsg
}

// readSplitGraph reads path as splitGraph. It refuses a graph whose large
// initializers keep their data in external files: the rewrite writes one
// self-contained file.
func readSplitGraph(f *os.File) (*splitGraph, error) {
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	r := &pbReader{r: f}
	var skel []byte
	sg := &splitGraph{}
	// ModelProto: 7 is the graph; 1 (ir_version) and 5 (model_version) are
	// the varints, every other field is length-delimited.
	err = r.fields(0, st.Size(), func(field int, m pbMsg) error {
		switch field {
		case 1, 5:
			skel = protowire.AppendTag(skel, protowire.Number(field), protowire.VarintType)
			skel = protowire.AppendVarint(skel, m.val)
			return nil
		case 7:
			graph, err := sg.readGraph(r, m)
			if err != nil {
				return err
			}
			skel = protowire.AppendTag(skel, 7, protowire.BytesType)
			skel = protowire.AppendBytes(skel, graph)
			return nil
		}
		var err error
		skel, err = appendField(r, skel, field, m)
		return err
	})
	if err != nil {
		return nil, err
	}
	sg.m = &onnxpb.ModelProto{}
	if err := proto.Unmarshal(skel, sg.m); err != nil {
		return nil, err
	}
	if sg.m.GetGraph() == nil {
		return nil, errors.New("no graph in the file")
	}
	return sg, nil
}

// readGraph returns the GraphProto's bytes without its large initializers,
// whose ranges it records.
func (sg *splitGraph) readGraph(r *pbReader, g pbMsg) ([]byte, error) {
	var out []byte
	err := r.fields(g.off, g.end, func(field int, m pbMsg) error {
		if field == 5 && m.end-m.off > smallInitializer {
			external := false
			// TensorProto: 14 is data_location (1 = EXTERNAL).
			err := r.fields(m.off, m.end, func(f int, v pbMsg) error {
				if f == 14 && v.off == v.end && v.val == 1 {
					external = true
				}
				return nil
			})
			if err != nil {
				return err
			}
			if external {
				return errors.New("weights in external data files are not supported")
			}
			sg.large = append(sg.large, m)
			return nil
		}
		var err error
		out, err = appendField(r, out, field, m)
		return err
	})
	return out, err
}

// appendField appends a length-delimited field read from the file to buf.
func appendField(r *pbReader, buf []byte, field int, m pbMsg) ([]byte, error) {
	b := make([]byte, m.end-m.off)
	if _, err := r.r.ReadAt(b, m.off); err != nil {
		return buf, err
	}
	buf = protowire.AppendTag(buf, protowire.Number(field), protowire.BytesType)
	return protowire.AppendBytes(buf, b), nil
}

// write writes the (rewritten) model and then a second graph field holding
// the large initializers copied from src: protobuf merges repeated
// occurrences of a message field, so readers see one graph.
func (sg *splitGraph) write(w io.Writer, src io.ReaderAt) error {
	b, err := proto.Marshal(sg.m)
	if err != nil {
		return err
	}
	if _, err := w.Write(b); err != nil {
		return err
	}
	var size uint64
	for _, m := range sg.large {
		n := uint64(m.end - m.off)
		size += uint64(protowire.SizeTag(5)) + uint64(protowire.SizeBytes(int(n)))
	}
	if len(sg.large) == 0 {
		return nil
	}
	head := protowire.AppendTag(nil, 7, protowire.BytesType)
	head = protowire.AppendVarint(head, size)
	if _, err := w.Write(head); err != nil {
		return err
	}
	for _, m := range sg.large {
		head = protowire.AppendTag(head[:0], 5, protowire.BytesType)
		head = protowire.AppendVarint(head, uint64(m.end-m.off))
		if _, err := w.Write(head); err != nil {
			return err
		}
		if _, err := io.Copy(w, io.NewSectionReader(src, m.off, m.end-m.off)); err != nil {
			return err
		}
	}
	return nil
}

// defaultOpset is the model's default-domain ("" or "ai.onnx") opset.
func defaultOpset(m *onnxpb.ModelProto) int64 {
	for _, o := range m.GetOpsetImport() {
		if o.GetDomain() == "" || o.GetDomain() == "ai.onnx" {
			return o.GetVersion()
		}
	}
	return 0
}

// rewriteGraph applies rewriteRelAttention to the graph at path and, when
// it changed anything, writes the result to an unnamed temporary file held
// open by the returned *os.File, whose /proc/self/fd path sessions load.
// The file disappears with the process (or Close), so nothing is left
// behind by a crash; a production-size graph takes as much temporary disk
// as the original, and about a second to copy.
func rewriteGraph(path string) (f *os.File, sessionPath string, st relAttnStats, err error) {
	if runtime.GOOS != "linux" {
		return nil, "", st, errors.New("rewritten graphs are loaded through /proc/self/fd, which only Linux has")
	}
	src, err := os.Open(path)
	if err != nil {
		return nil, "", st, err
	}
	defer src.Close()
	sg, err := readSplitGraph(src)
	if err != nil {
		return nil, "", st, fmt.Errorf("reading the graph: %w", err)
	}
	if st, err = rewriteRelAttention(sg.m.GetGraph(), defaultOpset(sg.m)); err != nil {
		return nil, "", st, err
	}
	if f, err = os.CreateTemp("", "scorer-graph-*.onnx"); err != nil {
		return nil, "", st, err
	}
	// Unlinked at once: the open file is the only name it needs.
	if err := os.Remove(f.Name()); err != nil {
		f.Close()
		return nil, "", st, err
	}
	bw := bufio.NewWriterSize(f, 1<<20)
	if err := sg.write(bw, src); err != nil {
		f.Close()
		return nil, "", st, fmt.Errorf("writing the rewritten graph: %w", err)
	}
	if err := bw.Flush(); err != nil {
		f.Close()
		return nil, "", st, fmt.Errorf("writing the rewritten graph: %w", err)
	}
	return f, fmt.Sprintf("/proc/self/fd/%d", f.Fd()), st, nil
}

// RelAttentionNodes names the nodes of the graph at path that the
// relative-attention rewrite replaces or leaves unused (the Tiles, the
// [rows·heads, L, 512] products, the index Expands, the GatherElements and
// what only they read), for profiles that compare the relative-position
// path's cost before and after; the nodes the rewrite adds are named with
// the prefix it returns. It is errNoRelAttention's error for a graph the
// rewrite does not recognise.
func RelAttentionNodes(path string) (removed []string, addedPrefix string, err error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, "", err
	}
	defer f.Close()
	sg, err := readSplitGraph(f)
	if err != nil {
		return nil, "", err
	}
	g := sg.m.GetGraph()
	before := slices.Clone(g.GetNode())
	addedPrefix = uniquePrefix(indexGraph(g), relAttnPrefix)
	if _, err := rewriteRelAttention(g, defaultOpset(sg.m)); err != nil {
		return nil, "", err
	}
	kept := map[*onnxpb.NodeProto]bool{}
	for _, n := range g.GetNode() {
		kept[n] = true
	}
	for _, n := range before {
		if !kept[n] {
			removed = append(removed, n.GetName())
		}
	}
	return removed, addedPrefix, nil
}
