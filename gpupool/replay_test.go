package gpupool

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
)

// benchFile is what a replay needs of `scorer gpu-proof bench`'s output:
// each shape's measured activation peak, and the memory the process held
// beside its weights before any shape ran.
type benchFile struct {
	Precision     string `json:"precision"`
	TF32          bool   `json:"tf32"`
	WeightBytes   uint64 `json:"weight_bytes"`
	NonArenaBytes uint64 `json:"non_arena_bytes"`
	Shapes        []struct {
		Rows            int    `json:"rows"`
		Len             int    `json:"len"`
		ActivationBytes uint64 `json:"activation_bytes"`
	} `json:"shapes"`
}

// The first GPU run (testdata/h200-2026-11-26: production-size DeBERTa-v3 on
// an H200, fp16, fp32 and fp32 with TF32) measured the activation peak of
// the planner's shapes: 48, 128 and 512 tokens at the rows 16,384 and 65,536
// token budgets give. Replayed through calibration (a fake engine whose
// arena grows by exactly what the GPU measured), what admission reserves
// for each shape is never more than 2% under the measurement, nor more than
// 15% over. The calibrated model of that run was 20% (fp16) and 35% (fp32)
// under at 48 tokens.
func TestMemoryModelReplaysH200Bench(t *testing.T) {
	files, err := filepath.Glob("testdata/h200-2026-11-26/bench-*.json")
	if err != nil || len(files) != 3 {
		t.Fatalf("bench files %v, %v: want the three of the first GPU run", files, err)
	}
	for _, name := range files {
		t.Run(filepath.Base(name), func(t *testing.T) {
			data, err := os.ReadFile(name)
			if err != nil {
				t.Fatal(err)
			}
			var b benchFile
			if err := json.Unmarshal(data, &b); err != nil {
				t.Fatal(err)
			}
			measured := map[Shape]uint64{}
			var shapes []Shape
			for _, s := range b.Shapes {
				sh := Shape{Rows: s.Rows, Len: s.Len}
				measured[sh] = s.ActivationBytes
				shapes = append(shapes, sh)
			}
			if len(shapes) < 6 {
				t.Fatalf("%d shapes, want the bench's six", len(shapes))
			}
			dev := &fakeDevice{total: 140 << 30}
			mem := transformerMem{weights: b.WeightBytes, context: b.NonArenaBytes / 2, stream: b.NonArenaBytes / 4}
			factory := func(Device) (Engine, error) {
				e, err := newArenaEngine(dev, mem, 0)
				if err == nil {
					e.need = func(rows, length int) uint64 { return measured[Shape{Rows: rows, Len: length}] }
				}
				return e, err
			}
			p, err := New(testCtx(t), factory, Mode(ModeCUDA), WithProbe(deviceProbe{dev}), CPUFallback(false),
				MaxBatchTokens(65536), MaxBatchRows(2048), Calibrate(Calibration{Shapes: shapes}))
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close(context.Background())
			st := p.Stats().Devices[0]
			t.Logf("%s tf32=%v: %.0f + %.3f MiB·rows + %.0f B·rows·len + %.1f B·rows·len², held-out margin %.1f%%",
				b.Precision, b.TF32, st.Memory.Base, st.Memory.PerRow/(1<<20), st.Memory.PerToken, st.Memory.PerTokenLen,
				100*st.Memory.HeldOut)
			for _, s := range shapes {
				got, want := st.Memory.Bytes(s.Rows, s.Len), float64(measured[s])
				r := got/want - 1
				t.Logf("%d×%d: admission reserves %.0f MiB, measured %.0f MiB (%+.1f%%)", s.Rows, s.Len, got/(1<<20), want/(1<<20), 100*r)
				if r < -0.02 || r > 0.15 {
					t.Errorf("%d×%d: admission reserves %.0f MiB against a measured %.0f MiB (%+.1f%%), want within -2%% and +15%%",
						s.Rows, s.Len, got/(1<<20), want/(1<<20), 100*r)
				}
			}
		})
	}
}
