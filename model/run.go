package model

import (
	"context"
	"fmt"
	"slices"

	ort "github.com/yalue/onnxruntime_go"

	"github.com/scorer/scorer/model/ortenv"
)

// Model is the model this session runs.
func (s *Session) Model() *Model { return s.m }

// MaxLength is the longest pair, in tokens, the session accepts: the
// model's maximum length. gpupool checks pairs and caps calibration with it.
func (s *Session) MaxLength() int { return s.m.MaxLength }

// ScorePairs returns P(entailment) for each pair under the model's
// ScoreMode, in input order (the fan-out's PairScorer; gpupool's Engine).
func (s *Session) ScorePairs(ctx context.Context, pairs []Pair) ([]float32, error) {
	logits, err := s.Logits(ctx, pairs)
	if err != nil {
		return nil, err
	}
	return s.probs(logits), nil
}

// ScorePairsReleasingArena is ScorePairs followed by ReleaseArena, in one
// run: ORT empties the arena at the end of the run that scored pairs, and
// the C heap is trimmed after it. gpupool's CPU calibration measures each
// shape this way, from an empty arena, without ReleaseArena's extra run,
// which on a production-size model costs as much as a short batch (every
// weight is read even for one token). ErrNoArenaShrink without
// SessionOptions.ShrinkArenas.
func (s *Session) ScorePairsReleasingArena(ctx context.Context, pairs []Pair) ([]float32, error) {
	if s.opts.ShrinkArenas == "" {
		return nil, ErrNoArenaShrink
	}
	logits, err := s.logits(ctx, pairs, map[string]string{"memory.enable_memory_arena_shrinkage": s.opts.ShrinkArenas})
	if err != nil {
		return nil, err
	}
	ortenv.TrimMalloc() // what the arena handed back to the C heap
	return s.probs(logits), nil
}

// probs is P(entailment) of each row of logits under the model's ScoreMode.
func (s *Session) probs(logits [][]float32) []float32 {
	m := s.m
	out := make([]float32, len(logits))
	for i, row := range logits {
		out[i] = entailmentProb(row, m.ScoreMode, m.EntailmentIndex, m.ContradictionIndex)
	}
	return out
}

// Logits runs the graph on pairs and returns one row of raw class logits per
// pair, in input order. The batch is padded to its longest pair, so callers
// that care about throughput should group pairs of similar length.
func (s *Session) Logits(ctx context.Context, pairs []Pair) ([][]float32, error) {
	return s.logits(ctx, pairs, nil)
}

// logits is Logits with extra run config entries (ORT's run option keys).
func (s *Session) logits(ctx context.Context, pairs []Pair, entries map[string]string) ([][]float32, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("model: scoring %d pairs: %w", len(pairs), err)
	}
	if len(pairs) == 0 {
		return [][]float32{}, nil
	}
	pairs, groups := s.m.eosRows(pairs)
	if groups != nil {
		return s.logitsGrouped(ctx, pairs, groups, entries)
	}
	feeds, rows, length, err := s.buildInputs(pairs)
	if err != nil {
		return nil, err
	}

	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return nil, ErrSessionClosed
	}

	inputs := make([]ort.Value, len(s.m.InputNames))
	for i, name := range s.m.InputNames {
		t, err := ort.NewTensor(ort.NewShape(int64(rows), int64(length)), feeds[name])
		if err != nil {
			return nil, fmt.Errorf("model: creating %s tensor %d×%d: %w", name, rows, length, err)
		}
		defer t.Destroy()
		inputs[i] = t
	}
	out, err := s.newOutput(rows)
	if err != nil {
		return nil, err
	}
	outputs := []ort.Value{out} // ORT allocates float32 logits; either way we destroy them below
	if err := s.runWith(ctx, inputs, outputs, rows, length, entries); err != nil {
		return nil, err
	}
	defer outputs[0].Destroy()

	classes := len(s.m.ID2Label)
	if sh := outputs[0].GetShape(); len(sh) != 2 || sh[0] != int64(rows) || sh[1] != int64(classes) {
		return nil, fmt.Errorf("model: output %q has shape %v, want [%d %d]", s.m.OutputName, sh, rows, classes)
	}
	flat, err := s.readLogits(outputs[0])
	if err != nil {
		return nil, err
	}
	return splitRows(flat, rows, classes), nil
}

// newOutput is the logits tensor a run writes into: nil (ORT allocates it)
// for float32, and for float16 a [rows, classes] buffer of ours.
// onnxruntime_go copies an ORT-allocated tensor of a type it has no Go type
// for by its element count, not its byte size, and so cannot return
// float16 logits itself.
func (s *Session) newOutput(rows int) (ort.Value, error) {
	if s.m.OutputType != ort.TensorElementDataTypeFloat16 {
		return nil, nil
	}
	classes := len(s.m.ID2Label)
	t, err := ort.NewCustomDataTensor(ort.NewShape(int64(rows), int64(classes)), make([]byte, 2*rows*classes), ort.TensorElementDataTypeFloat16)
	if err != nil {
		return nil, fmt.Errorf("model: creating float16 %s tensor %d×%d: %w", s.m.OutputName, rows, classes, err)
	}
	return t, nil
}

// readLogits copies the logits out of v as float32 (v's buffer is freed
// with it): float32 as they are, float16 converted exactly.
func (s *Session) readLogits(v ort.Value) ([]float32, error) {
	switch t := v.(type) {
	case *ort.Tensor[float32]:
		data := t.GetData() // aliases ORT's buffer
		flat := make([]float32, len(data))
		copy(flat, data)
		return flat, nil
	case *ort.CustomDataTensor:
		if ort.TensorElementDataType(t.DataType()) != ort.TensorElementDataTypeFloat16 {
			break
		}
		return float16sToFloat32(t.GetData()), nil
	}
	return nil, fmt.Errorf("model: output %q is %T, want a %s tensor", s.m.OutputName, v, s.m.OutputType)
}

// splitRows cuts flat into rows of classes, sharing its backing array.
func splitRows(flat []float32, rows, classes int) [][]float32 {
	out := make([][]float32, rows)
	for i := range out {
		out[i] = flat[i*classes : (i+1)*classes : (i+1)*classes]
	}
	return out
}

// runWith calls ORT with a per-call RunOptions carrying entries (ORT's run
// config keys) that a context watcher terminates when ctx ends: ORT's Run
// ignores Go contexts. runWith returns only after Run has returned, so the
// caller may free the tensors.
func (s *Session) runWith(ctx context.Context, inputs, outputs []ort.Value, rows, length int, entries map[string]string) error {
	ro, err := ort.NewRunOptions()
	if err != nil {
		return fmt.Errorf("model: creating run options: %w", err)
	}
	defer ro.Destroy()
	for k, v := range entries {
		if err := ro.AddRunConfigEntry(k, v); err != nil {
			return fmt.Errorf("model: run option %s=%s: %w", k, v, err)
		}
	}

	terminated := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		defer close(terminated)
		_ = ro.Terminate() // Run then fails fast; its error is reported below as ctx's
	})
	runErr := s.sess.RunWithOptions(inputs, outputs, ro)
	if !stop() {
		// The watcher started; wait for it before ro is destroyed.
		<-terminated
	}
	if ctx.Err() != nil {
		if runErr == nil && outputs[0] != nil {
			// Run finished before the terminate flag was read; the result is
			// fine but the caller has given up, so drop it.
			outputs[0].Destroy()
			outputs[0] = nil
		}
		return fmt.Errorf("model: scoring %d×%d batch: %w", rows, length, context.Cause(ctx))
	}
	if runErr != nil {
		if outputs[0] != nil {
			outputs[0].Destroy()
			outputs[0] = nil
		}
		return classifyRunError(runErr, rows, length)
	}
	if outputs[0] == nil {
		return fmt.Errorf("model: running %d×%d batch: ORT returned no %q output", rows, length, s.m.OutputName)
	}
	return nil
}

// buildInputs pads pairs to the longest (rounded up by PadLength) and lays out the int64 feeds by input
// name. Pads get the tokenizer's pad id, mask 0 and type id 0, so they are
// invisible to attention and the result matches scoring each pair alone.
func (s *Session) buildInputs(pairs []Pair) (map[string][]int64, int, int, error) {
	rows, length := len(pairs), 0
	for i, p := range pairs {
		if len(p.IDs) == 0 {
			return nil, 0, 0, fmt.Errorf("%w: pair %d is empty", ErrInvalidInput, i)
		}
		if p.TypeIDs != nil && len(p.TypeIDs) != len(p.IDs) {
			return nil, 0, 0, fmt.Errorf("%w: pair %d has %d ids but %d type ids", ErrInvalidInput, i, len(p.IDs), len(p.TypeIDs))
		}
		if len(p.IDs) > s.m.MaxLength {
			return nil, 0, 0, fmt.Errorf("%w: pair %d has %d tokens, max length is %d", ErrInvalidInput, i, len(p.IDs), s.m.MaxLength)
		}
		length = max(length, len(p.IDs))
	}
	length = s.PadLength(length)
	pad := int64(s.m.Tokenizer.PadID())
	ids := make([]int64, rows*length)
	mask := make([]int64, rows*length)
	var types []int64
	if slices.Contains(s.m.InputNames, inputTypeIDs) {
		types = make([]int64, rows*length)
	}
	for r, p := range pairs {
		row := ids[r*length : (r+1)*length]
		for j := range row {
			if j < len(p.IDs) {
				row[j] = int64(p.IDs[j])
				mask[r*length+j] = 1
			} else {
				row[j] = pad
			}
		}
		if types != nil {
			for j, v := range p.TypeIDs {
				types[r*length+j] = int64(v)
			}
		}
	}
	feeds := map[string][]int64{inputIDs: ids, inputMask: mask}
	if types != nil {
		feeds[inputTypeIDs] = types
	}
	return feeds, rows, length, nil
}
