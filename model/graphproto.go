package model

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"strconv"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/scorer/scorer/model/onnxpb"
)

// A graph file is read one way, here: the protobuf's framing is walked
// through a small window (pbReader), so a weight is skipped by a seek, never
// read, and what is kept (the nodes, the declarations, the small constants,
// each large initializer as a reference to where its bytes lie) is decoded
// by the generated model/onnxpb. Load, RelAttentionNodes and
// WriteExternalData all read this lean graph; Load reads it once and takes
// the graph's inputs and outputs from it (graphIO).
//
// Why not proto.Unmarshal the file: it needs the whole file in memory.
// On the production stand-in (1.7 GB, weights inline) reading and
// decoding it took 72 s and 1.7 GB of heap where the lean read takes
// 40-115 ms and 15 MB (2 cores, loaded machine, file cached).

// graphValue is one graph input or output as ONNX declares it: a name, the
// tensor element type (onnx.proto TensorProto.DataType) and a shape whose
// symbolic dimensions are -1, as ORT reports them.
type graphValue struct {
	name     string
	elemType uint64
	dims     []int64
}

// ONNX tensor element types (onnx.proto TensorProto.DataType) that this
// package and its test fixtures name.
const (
	onnxFloat = 1
	onnxInt64 = 7
)

// graphIO returns the inputs a session must be fed (graph inputs that are
// not initializers, as ORT counts them) and the graph outputs, from the
// graph as the lean read decoded it.
//
// Why not ask ORT: its only way (onnxruntime_go's GetInputOutputInfo) builds
// a whole session, which for a production-size model reads and optimises the
// 1.7 GB graph once more at start (about 3 s and a transient 3 GB), and the
// memory it frees stays in the C heap.
func graphIO(g *onnxpb.GraphProto) (inputs, outputs []graphValue) {
	initializers := map[string]bool{}
	for _, t := range g.GetInitializer() {
		initializers[t.GetName()] = true
	}
	for _, v := range g.GetInput() {
		if !initializers[v.GetName()] {
			inputs = append(inputs, valueOf(v))
		}
	}
	for _, v := range g.GetOutput() {
		outputs = append(outputs, valueOf(v))
	}
	return inputs, outputs
}

// valueOf is a ValueInfoProto's name, tensor element type and shape, each
// dimension without a value (a dim_param, or none) -1.
func valueOf(v *onnxpb.ValueInfoProto) graphValue {
	t := v.GetType().GetTensorType()
	gv := graphValue{name: v.GetName(), elemType: uint64(t.GetElemType())}
	for _, d := range t.GetShape().GetDim() {
		dim := int64(-1)
		if dv, ok := d.GetValue().(*onnxpb.TensorShapeProto_Dimension_DimValue); ok {
			dim = dv.DimValue
		}
		gv.dims = append(gv.dims, dim)
	}
	return gv
}

// pbMsg is a length-delimited field's value: bytes [off, end) of the file.
// For varint fields val holds the value, off == end and varint is set.
type pbMsg struct {
	off, end int64
	val      uint64
	varint   bool
}

// pbReader walks protobuf messages in a file through a small read window,
// so skipping a field costs a seek, not a read.
type pbReader struct {
	r      io.ReaderAt
	win    [64 << 10]byte
	winOff int64
	winLen int
}

var errMalformed = errors.New("malformed protobuf")

func (p *pbReader) byteAt(off int64) (byte, error) {
	if off < p.winOff || off >= p.winOff+int64(p.winLen) {
		n, err := p.r.ReadAt(p.win[:], off)
		if n == 0 {
			if err == nil || err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return 0, err
		}
		p.winOff, p.winLen = off, n
	}
	return p.win[off-p.winOff], nil
}

func (p *pbReader) varint(off, end int64) (uint64, int64, error) {
	var v uint64
	for shift := uint(0); shift < 64; shift += 7 {
		if off >= end {
			return 0, 0, errMalformed
		}
		b, err := p.byteAt(off)
		if err != nil {
			return 0, 0, err
		}
		off++
		v |= uint64(b&0x7f) << shift
		if b < 0x80 {
			return v, off, nil
		}
	}
	return 0, 0, errMalformed
}

// fields calls fn for every varint or length-delimited field of the
// message in [off, end), skipping fixed-width ones.
func (p *pbReader) fields(off, end int64, fn func(field int, m pbMsg) error) error {
	for off < end {
		tag, next, err := p.varint(off, end)
		if err != nil {
			return err
		}
		off = next
		field := int(tag >> 3)
		if field == 0 {
			return errMalformed
		}
		switch tag & 7 {
		case 0:
			v, next, err := p.varint(off, end)
			if err != nil {
				return err
			}
			off = next
			if err := fn(field, pbMsg{off: off, end: off, val: v, varint: true}); err != nil {
				return err
			}
		case 1:
			off += 8
		case 5:
			off += 4
		case 2:
			n, next, err := p.varint(off, end)
			if err != nil {
				return err
			}
			if n > uint64(end-next) {
				return errMalformed
			}
			off = next + int64(n)
			if err := fn(field, pbMsg{off: next, end: off}); err != nil {
				return err
			}
		default:
			return errMalformed
		}
	}
	if off != end {
		return errMalformed
	}
	return nil
}

// smallInitializer is the largest initializer, in encoded bytes, that
// reading a graph decodes; larger ones (the weights) are not read at all:
// leanGraph references their bytes where they lie in the file, so a
// 1.7 GB graph is held as its nodes and small constants (a few MB).
const smallInitializer = 16 << 10

// readLeanGraph reads the graph file at path as a leanGraph and checks
// every external data reference it holds: a location inside the folder, a
// file that exists and holds the bytes referenced. It closes the files it
// read (openLeanGraph keeps them open).
func readLeanGraph(path string) (*leanGraph, error) {
	lg, err := openLeanGraph(path)
	if err != nil {
		return nil, err
	}
	lg.close()
	return lg, nil
}

// openLeanGraph is readLeanGraph with the files it read left open in lg
// (held) until lg.close.
func openLeanGraph(path string) (_ *leanGraph, err error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	lg := &leanGraph{held: []heldFile{{f: f, stamp: stampOf(st)}}}
	defer func() {
		if err != nil {
			lg.close()
		}
	}()
	self := filepath.Base(path)
	r := &pbReader{r: f}
	var skel []byte
	// ModelProto: 7 is the graph; every other field is copied as it is.
	err = r.fields(0, st.Size(), func(field int, m pbMsg) error {
		if field == 7 {
			graph, err := readLeanGraphProto(r, m, self)
			if err != nil {
				return err
			}
			skel = protowire.AppendTag(skel, 7, protowire.BytesType)
			skel = protowire.AppendBytes(skel, graph)
			return nil
		}
		var err error
		skel, err = appendAny(r, skel, field, m)
		return err
	})
	if err != nil {
		return nil, err
	}
	lg.m = &onnxpb.ModelProto{}
	if err := proto.Unmarshal(skel, lg.m); err != nil {
		return nil, err
	}
	if lg.m.GetGraph() == nil {
		return nil, errors.New("no graph in the file")
	}
	if err := lg.locate(path); err != nil {
		return nil, err
	}
	return lg, nil
}

// readLeanGraphProto returns the GraphProto's bytes with each large
// initializer's inline data replaced by a reference to where it lies in
// the graph file, named self in its folder.
func readLeanGraphProto(r *pbReader, g pbMsg, self string) ([]byte, error) {
	var out []byte
	err := r.fields(g.off, g.end, func(field int, m pbMsg) error {
		if field == 5 && m.end-m.off > smallInitializer {
			t, err := leanTensor(r, m, self)
			if err != nil {
				return err
			}
			out = protowire.AppendTag(out, 5, protowire.BytesType)
			out = protowire.AppendBytes(out, t)
			return nil
		}
		var err error
		out, err = appendAny(r, out, field, m)
		return err
	})
	return out, err
}

// leanTensor returns the TensorProto m with its raw_data replaced by an
// external data reference to the same bytes in the graph file. A tensor
// whose data is in a typed field (float_data and the like: exporters write
// raw_data) is copied whole.
func leanTensor(r *pbReader, m pbMsg, self string) ([]byte, error) {
	var out []byte
	var raw *pbMsg
	// TensorProto: 9 is raw_data, 13 external_data, 14 data_location.
	err := r.fields(m.off, m.end, func(f int, v pbMsg) error {
		switch f {
		case 9:
			raw = &v
			return nil
		case 13, 14:
			return nil
		}
		var err error
		out, err = appendAny(r, out, f, v)
		return err
	})
	if err != nil {
		return nil, err
	}
	if raw == nil {
		return appendAny(r, nil, 0, m) // the message as exported
	}
	for _, kv := range [][2]string{
		{"location", self},
		{"offset", strconv.FormatInt(raw.off, 10)},
		{"length", strconv.FormatInt(raw.end-raw.off, 10)},
	} {
		var e []byte
		e = protowire.AppendTag(e, 1, protowire.BytesType)
		e = protowire.AppendString(e, kv[0])
		e = protowire.AppendTag(e, 2, protowire.BytesType)
		e = protowire.AppendString(e, kv[1])
		out = protowire.AppendTag(out, 13, protowire.BytesType)
		out = protowire.AppendBytes(out, e)
	}
	out = protowire.AppendTag(out, 14, protowire.VarintType)
	return protowire.AppendVarint(out, uint64(onnxpb.TensorProto_EXTERNAL)), nil
}

// appendAny appends a varint or length-delimited field read from the file
// to buf. Field 0 means m's bytes themselves, unframed.
func appendAny(r *pbReader, buf []byte, field int, m pbMsg) ([]byte, error) {
	if m.varint {
		buf = protowire.AppendTag(buf, protowire.Number(field), protowire.VarintType)
		return protowire.AppendVarint(buf, m.val), nil
	}
	b := make([]byte, m.end-m.off)
	if _, err := r.r.ReadAt(b, m.off); err != nil {
		return buf, err
	}
	if field == 0 {
		return append(buf, b...), nil
	}
	buf = protowire.AppendTag(buf, protowire.Number(field), protowire.BytesType)
	return protowire.AppendBytes(buf, b), nil
}
