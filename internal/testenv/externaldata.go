package testenv

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/scorer/scorer/model/onnxpb"
)

// ExternalLayout is how ExternalDataModelDir lays out a graph's weights.
type ExternalLayout int

const (
	// OneDataFile is torch.onnx's and Optimum's form, what onnx.save_model
	// writes with save_as_external_data=True and all_tensors_to_one_file:
	// every tensor of 1 KiB or more in model.onnx_data beside the graph,
	// each at an offset aligned to 4 KiB.
	OneDataFile ExternalLayout = iota
	// FilePerTensor is onnx.save_model's all_tensors_to_one_file=False,
	// here with the files in a subfolder: relative locations with a
	// folder in them, each tensor at offset 0 of its own file.
	FilePerTensor
)

// externalThreshold is onnx.save_model's default size_threshold: smaller
// tensors stay in the graph.
const externalThreshold = 1024

// ExternalDataModelDir makes a model folder for the test: src's files
// (linked) with its model.onnx re-saved with external data in the given
// layout. The folder has src's base name, so results name the same model.
func ExternalDataModelDir(t testing.TB, src string, layout ExternalLayout) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), filepath.Base(src))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	entries, err := os.ReadDir(src)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.IsDir() || e.Name() == "model.onnx" {
			continue
		}
		if err := os.Symlink(filepath.Join(src, e.Name()), filepath.Join(dir, e.Name())); err != nil {
			t.Fatal(err)
		}
	}
	if err := saveExternal(filepath.Join(src, "model.onnx"), dir, layout); err != nil {
		t.Fatalf("re-saving %s with external data: %v", src, err)
	}
	return dir
}

func saveExternal(src, dir string, layout ExternalLayout) error {
	b, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	m := &onnxpb.ModelProto{}
	if err := proto.Unmarshal(b, m); err != nil {
		return err
	}
	var one *os.File
	if layout == OneDataFile {
		if one, err = os.Create(filepath.Join(dir, "model.onnx_data")); err != nil {
			return err
		}
		defer one.Close()
	} else if err := os.MkdirAll(filepath.Join(dir, "weights"), 0o755); err != nil {
		return err
	}
	var off int64
	for i, tp := range m.GetGraph().GetInitializer() {
		data := tp.GetRawData()
		if len(data) < externalThreshold {
			continue
		}
		var loc string
		var at int64
		switch layout {
		case OneDataFile:
			loc = "model.onnx_data"
			if pad := off % 4096; pad != 0 {
				off += 4096 - pad
			}
			if _, err := one.WriteAt(data, off); err != nil {
				return err
			}
			at = off
			off += int64(len(data))
		case FilePerTensor:
			loc = fmt.Sprintf("weights/tensor_%d.bin", i)
			if err := os.WriteFile(filepath.Join(dir, loc), data, 0o644); err != nil {
				return err
			}
		}
		tp.RawData = nil
		tp.DataLocation = onnxpb.TensorProto_EXTERNAL.Enum()
		tp.ExternalData = []*onnxpb.StringStringEntryProto{
			{Key: proto.String("location"), Value: proto.String(loc)},
			{Key: proto.String("offset"), Value: proto.String(strconv.FormatInt(at, 10))},
			{Key: proto.String("length"), Value: proto.String(strconv.Itoa(len(data)))},
		}
	}
	out, err := proto.Marshal(m)
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "model.onnx"), out, 0o644)
}
