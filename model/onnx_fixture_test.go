package model

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"testing"
)

// This file writes tiny ONNX graphs for Load's graph checks: graphs with an
// input we cannot feed, a float input, or a wrong class count. No ONNX
// tooling is available to the tests, so the protobuf is written by hand from
// onnx.proto's field numbers; ORT then parses it like any other model.

type pb []byte

func (b pb) varint(field int, v uint64) pb {
	b = binary.AppendUvarint(b, uint64(field)<<3) // wire type 0: varint
	return binary.AppendUvarint(b, v)
}

func (b pb) bytes(field int, v []byte) pb {
	b = binary.AppendUvarint(b, uint64(field)<<3|2)
	b = binary.AppendUvarint(b, uint64(len(v)))
	return append(b, v...)
}

func (b pb) str(field int, s string) pb { return b.bytes(field, []byte(s)) }

// fakeIO is one graph input or output: a name, an element type and a shape
// whose entries are a symbolic name ("batch") or a fixed size.
type fakeIO struct {
	name string
	elem int
	dims []any
}

func (io fakeIO) valueInfo() pb {
	var shape pb
	for _, d := range io.dims {
		switch d := d.(type) {
		case string:
			shape = shape.bytes(1, pb(nil).str(2, d))
		case int:
			shape = shape.bytes(1, pb(nil).varint(1, uint64(d)))
		}
	}
	tensor := pb(nil).varint(1, uint64(io.elem)).bytes(2, shape)
	typ := pb(nil).bytes(1, tensor)
	return pb(nil).str(1, io.name).bytes(2, typ)
}

// writeTinyONNX writes a graph whose every output is a Cast of input_ids to
// the output's type; ORT accepts unused inputs, so any input list works.
func writeTinyONNX(t *testing.T, path string, inputs, outputs []fakeIO) {
	t.Helper()
	var graph pb
	for _, o := range outputs {
		attr := pb(nil).str(1, "to").varint(3, uint64(o.elem)).varint(20, 2) // type INT
		node := pb(nil).str(1, "input_ids").str(2, o.name).str(3, "cast_"+o.name).str(4, "Cast").bytes(5, attr)
		graph = graph.bytes(1, node)
	}
	graph = graph.str(2, "tiny")
	for _, in := range inputs {
		graph = graph.bytes(11, in.valueInfo())
	}
	for _, o := range outputs {
		graph = graph.bytes(12, o.valueInfo())
	}
	opset := pb(nil).str(1, "").varint(2, 14)
	model := pb(nil).varint(1, 8).str(2, "scorer-test").bytes(7, graph).bytes(8, opset)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, model, 0o644); err != nil {
		t.Fatal(err)
	}
}
