package model

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	ort "github.com/yalue/onnxruntime_go"

	"github.com/scorer/scorer/internal/testenv"
)

// TestGraphIOMatchesORT reads every ONNX file of every shared model folder
// (the int8 exports included) and a hand-written graph whose input list
// repeats an initializer, and checks that the lean read finds exactly what
// an ORT session reports: names, element types and shapes of the inputs a
// session is fed and of the outputs.
func TestGraphIOMatchesORT(t *testing.T) {
	var files []string
	for _, dir := range testenv.ModelDirs(t) {
		found, _ := filepath.Glob(filepath.Join(dir, "*.onnx"))
		more, _ := filepath.Glob(filepath.Join(dir, "onnx", "*.onnx"))
		files = append(files, append(found, more...)...)
	}
	withInit := filepath.Join(t.TempDir(), "with-initializer.onnx")
	writeTinyONNXWithInitializer(t, withInit)
	files = append(files, withInit)
	if len(files) < 4 {
		t.Fatalf("found %d ONNX files under the shared models, want the fp32 and int8 graphs", len(files))
	}
	for _, f := range files {
		name, err := filepath.Rel(filepath.Dir(filepath.Dir(f)), f)
		if err != nil {
			name = f
		}
		t.Run(name, func(t *testing.T) {
			lg, err := readLeanGraph(f)
			if err != nil {
				t.Fatal(err)
			}
			ins, outs := graphIO(lg.m.GetGraph())
			wantIns, wantOuts, err := ort.GetInputOutputInfo(f)
			if err != nil {
				t.Fatal(err)
			}
			same := func(kind string, got []graphValue, want []ort.InputOutputInfo) {
				if len(got) != len(want) {
					t.Fatalf("%s: got %d %v, ORT says %d %v", kind, len(got), got, len(want), want)
				}
				for i := range got {
					w := want[i]
					if got[i].name != w.Name || got[i].elemType != uint64(w.DataType) || !slices.Equal(got[i].dims, []int64(w.Dimensions)) {
						t.Errorf("%s %d: got %+v, ORT says %s %s %v", kind, i, got[i], w.Name, w.DataType, w.Dimensions)
					}
				}
			}
			same("inputs", ins, wantIns)
			same("outputs", outs, wantOuts)
		})
	}
	for _, bad := range [][]byte{[]byte("not a graph"), {0x3a, 0x05, 0x0a}, {}} {
		f := filepath.Join(t.TempDir(), "bad.onnx")
		if err := os.WriteFile(f, bad, 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := readLeanGraph(f); err == nil {
			t.Errorf("readLeanGraph(%q) = nil error", bad)
		}
	}
}

// writeTinyONNXWithInitializer writes a graph that lists an initializer
// among its inputs (as IR version 3 exports did): ORT does not count it as
// an input a session must be fed.
func writeTinyONNXWithInitializer(t *testing.T, path string) {
	t.Helper()
	ids := fakeIO{"input_ids", onnxInt64, []any{"batch", "seq"}}
	mask := fakeIO{"attention_mask", onnxInt64, []any{"batch", "seq"}}
	bias := fakeIO{"bias", onnxFloat, []any{2}}
	out := fakeIO{"logits", onnxFloat, []any{"batch", 2}}
	// bias = [0, 0] as raw float32 bytes: dims 1, data_type 2, name 8, raw_data 9.
	init := pb(nil).varint(1, 2).varint(2, onnxFloat).str(8, "bias").bytes(9, make([]byte, 8))
	cast := pb(nil).str(1, "to").varint(3, onnxFloat).varint(20, 2)
	node := pb(nil).str(1, "input_ids").str(2, "logits").str(3, "cast").str(4, "Cast").bytes(5, cast)
	graph := pb(nil).bytes(1, node).str(2, "tiny").bytes(5, init).
		bytes(11, ids.valueInfo()).bytes(11, mask.valueInfo()).bytes(11, bias.valueInfo()).bytes(12, out.valueInfo())
	opset := pb(nil).str(1, "").varint(2, 14)
	model := pb(nil).varint(1, 8).str(2, "scorer-test").bytes(7, graph).bytes(8, opset)
	if err := os.WriteFile(path, model, 0o644); err != nil {
		t.Fatal(err)
	}
}
