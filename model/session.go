package model

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	ort "github.com/yalue/onnxruntime_go"

	"github.com/scorer/scorer/model/ortenv"
)

// SessionOptions tunes one ORT session.
type SessionOptions struct {
	// IntraOpThreads is ORT's thread count inside one operator; 0 leaves
	// ORT's default (one per physical core).
	IntraOpThreads int
	// InterOpThreads is ORT's thread count across independent operators; 0
	// leaves ORT's default.
	InterOpThreads int
	// CUDA, when set, runs the session on the CUDA execution provider with
	// these provider options (device_id, gpu_mem_limit, use_tf32, ...;
	// ortenv.AppendCUDA adds it): how gpupool puts a session on a GPU
	// without importing ONNX Runtime. MemoryKey names them
	// (ortenv.CUDAKey); a CUDA session keeps no graph cache.
	CUDA map[string]string
	// Configure, when set, edits the ORT options before the session is
	// created, after CUDA: for tests and tools that set what the options
	// above do not.
	Configure func(*ort.SessionOptions) error
	// ConfigureKey names what Configure does to a session's memory (the
	// provider and its options), so MemoryKey can name a session that has
	// Configure; without it such a session has no MemoryKey.
	ConfigureKey string
	// DisableMemPattern turns off ORT's memory-pattern planning, which
	// allocates one block of a shape's whole peak on its second run; a
	// caller modelling device memory per batch (gpupool, for CUDA) needs
	// allocations to follow the run.
	DisableMemPattern bool
	// ShrinkArenas is ORT's memory.enable_memory_arena_shrinkage run option
	// value ("gpu:0", "cpu:0;gpu:0") used by ReleaseArena; empty means
	// ReleaseArena is not supported.
	ShrinkArenas string
	// PadToMultipleOf rounds every batch's length up to a multiple of it
	// (Hugging Face's pad_to_multiple_of), never past the model's maximum
	// length; 0 and 1 pad to the longest pair only. ONNX Runtime's CUDA
	// attention takes its fused kernels only at lengths that are multiples
	// of 8 in fp16 and falls to an unfused path with 2·rows·heads·len² of
	// scratch otherwise; the padded positions are masked like any pad.
	PadToMultipleOf int
	// GraphCache, when set, is the folder where ONNX Runtime's optimised
	// graph of this session, with its prepacked weights, is kept between
	// starts (optcache.go): NewSession loads it from there when an entry
	// for this model version, these options, ONNX Runtime release and
	// CPU was written and checks out, and Session.BuildGraphCache writes
	// one. Ignored with Configure (execution providers' graphs are the
	// device's).
	GraphCache string
}

// Session runs a Model's graph on one device. It is safe for concurrent use:
// DynamicAdvancedSession allows concurrent Run, and every call gets its own
// tensors. Create one per device and keep it for the life of the process;
// ORT does not return a destroyed session's memory reliably.
type Session struct {
	m    *Model
	sess *ort.DynamicAdvancedSession
	opts SessionOptions

	// mu is read-held by every Run and write-held by Close, so Close waits
	// for calls in flight and no call starts on a destroyed session.
	mu     sync.RWMutex
	closed bool

	// cache is what NewSession made of opts.GraphCache.
	cache GraphCacheResult
}

// externalFolderKey is ORT's session option (onnxruntime_session_options_
// config_keys.h) naming the folder that external data locations are
// relative to when the graph is loaded from memory.
const externalFolderKey = "session.model_external_initializers_file_folder_path"

// ErrModelFileChanged is NewSession's error once a model file was written
// in place, replaced (another file renamed over it) or removed since Load
// read it, and its bytes are not the same: a session would run weights
// other than the model's version. The bytes that were loaded cannot be
// read again; restarting the process loads the files as they are. gpupool
// reports it as an engine that cannot be opened.
var ErrModelFileChanged = errors.New("model: a model file changed on disk")

// NewSession creates an ORT session for the model's graph. It refuses
// with ErrModelFileChanged when a model file changed since Load read it.
func (m *Model) NewSession(opts SessionOptions) (*Session, error) {
	if opts.IntraOpThreads < 0 || opts.InterOpThreads < 0 {
		return nil, fmt.Errorf("model: negative thread count (intra %d, inter %d)", opts.IntraOpThreads, opts.InterOpThreads)
	}
	if err := m.checkFiles(); err != nil {
		return nil, err
	}
	var sess *ort.DynamicAdvancedSession
	var cache GraphCacheResult
	if key := sessionOpts(opts).graphCacheKey(m); opts.GraphCache != "" && opts.CUDA == nil && key != "" {
		so, err := m.sessionOptions(opts)
		if err != nil {
			return nil, err
		}
		sess, cache = m.newCachedSession(opts.GraphCache, key, so)
		so.Destroy()
	}
	if sess == nil {
		var err error
		if sess, err = m.newPlainSession(opts); err != nil {
			return nil, err
		}
	}
	// A write while ORT read the files may have given it some of the new
	// bytes.
	m.filesMu.Lock()
	i, is, err := m.changedFile()
	if err == nil && i >= 0 {
		err = m.changed(i, is, "while a session was created from it")
	}
	m.filesMu.Unlock()
	if err != nil {
		sess.Destroy()
		return nil, err
	}
	// Loading held the file's protobuf beside the weights; that memory is
	// free now but stays resident until trimmed.
	trimMalloc()
	return &Session{m: m, sess: sess, opts: opts, cache: cache}, nil
}

// trimMalloc hands the C heap's free pages back (ortenv.TrimMalloc).
func trimMalloc() { ortenv.TrimMalloc() }

// newPlainSession creates the session from the model's graph, as ORT
// optimises it.
func (m *Model) newPlainSession(opts SessionOptions) (*ort.DynamicAdvancedSession, error) {
	so, err := m.sessionOptions(opts)
	if err != nil {
		return nil, err
	}
	defer so.Destroy()
	// The graph is loaded from memory (Model.graph), its weights mapped
	// from the files it references; ORT resolves those against this folder,
	// as it would against a graph file's own.
	if err := so.AddSessionConfigEntry(externalFolderKey, m.graphDir); err != nil {
		return nil, fmt.Errorf("model: setting the external data folder: %w", err)
	}
	if opts.CUDA != nil {
		if err := ortenv.AppendCUDA(so, opts.CUDA); err != nil {
			return nil, fmt.Errorf("model: configuring session for %s: %w", m.Name, err)
		}
	}
	if opts.Configure != nil {
		if err := opts.Configure(so); err != nil {
			return nil, fmt.Errorf("model: configuring session for %s: %w", m.Name, err)
		}
	}
	sess, err := ort.NewDynamicAdvancedSessionWithONNXData(m.graph, m.InputNames, []string{m.OutputName}, so)
	if err != nil {
		if isOutOfMemory(err) {
			return nil, fmt.Errorf("model: creating session for %s: %w: %w", m.ONNXPath, ErrOutOfMemory, err)
		}
		return nil, fmt.Errorf("model: creating session for %s: %w", m.ONNXPath, err)
	}
	return sess, nil
}

// sessionOptions is ORT's options for a session with opts, less where its
// graph comes from (the external data folder, Configure's providers).
func (m *Model) sessionOptions(opts SessionOptions) (*ort.SessionOptions, error) {
	so, err := ort.NewSessionOptions()
	if err != nil {
		return nil, fmt.Errorf("model: creating session options: %w", err)
	}
	if opts.IntraOpThreads > 0 {
		if err := so.SetIntraOpNumThreads(opts.IntraOpThreads); err != nil {
			so.Destroy()
			return nil, fmt.Errorf("model: setting intra-op threads to %d: %w", opts.IntraOpThreads, err)
		}
	}
	if opts.InterOpThreads > 0 {
		if err := so.SetInterOpNumThreads(opts.InterOpThreads); err != nil {
			so.Destroy()
			return nil, fmt.Errorf("model: setting inter-op threads to %d: %w", opts.InterOpThreads, err)
		}
	}
	if opts.DisableMemPattern {
		if err := so.SetMemPattern(false); err != nil {
			so.Destroy()
			return nil, fmt.Errorf("model: disabling memory patterns: %w", err)
		}
	}
	return so, nil
}

// GraphCache says whether the session was loaded from
// SessionOptions.GraphCache, and if not, why.
func (s *Session) GraphCache() GraphCacheResult { return s.cache }

// fileState is a held file as it is now: the stamp of what its
// descriptor reads, and whether the path ORT opens (heldFile.real) still
// names it, names another file (moved: named is that file's stamp) or
// was removed.
type fileState struct {
	stamp, named   fileStamp
	moved, removed bool
}

// fileStates are the held files' states now, in m.held's order. filesMu
// is held.
func (m *Model) fileStates() ([]fileState, error) {
	out := make([]fileState, len(m.held))
	for i, h := range m.held {
		st, err := h.f.Stat()
		if err != nil {
			return nil, fmt.Errorf("model: checking %s: %w", h.path, err)
		}
		fs := fileState{stamp: stampOf(st)}
		if named, err := os.Stat(h.real); errors.Is(err, os.ErrNotExist) {
			fs.removed = true
		} else if err != nil {
			return nil, fmt.Errorf("model: checking %s: %w", h.real, err)
		} else if !os.SameFile(named, st) {
			fs.moved, fs.named = true, stampOf(named)
		}
		out[i] = fs
	}
	return out, nil
}

// firstChanged is the index of the first of states (fileStates) whose
// file changed since it was read, -1 when none did. filesMu is held.
func (m *Model) firstChanged(states []fileState) int {
	for i, fs := range states {
		if fs != (fileState{stamp: m.held[i].stamp}) {
			return i
		}
	}
	return -1
}

// changedFile is the first held file that changed since it was read, and
// its state; -1 when none did. filesMu is held.
func (m *Model) changedFile() (int, fileState, error) {
	states, err := m.fileStates()
	if err != nil {
		return 0, fileState{}, err
	}
	if i := m.firstChanged(states); i >= 0 {
		return i, states[i], nil
	}
	return -1, fileState{}, nil
}

// changed is the ErrModelFileChanged of held file i, now in state is;
// when says since when. filesMu is held.
func (m *Model) changed(i int, is fileState, when string) error {
	was := m.held[i].stamp
	what := fmt.Sprintf("written in place %s (modified at %s)", when, time.Unix(0, is.stamp.mtime).UTC().Format(time.RFC3339Nano))
	switch {
	case is.removed:
		what = "removed " + when
	case is.moved:
		what = "replaced by another file " + when
	case was.size != is.stamp.size:
		what = fmt.Sprintf("written in place %s (%d bytes, was %d)", when, is.stamp.size, was.size)
	}
	version := "the version being loaded"
	if m.hashed != "" {
		version = "version " + m.hashed[:12]
	}
	name := m.held[i].path
	if r := m.held[i].real; r != name {
		name += " (" + r + ")"
	}
	return fmt.Errorf("%w: %s was %s: a session would not run %s; restart the process to load the model as it is now",
		ErrModelFileChanged, name, what, version)
}

// hashedAs records the version Load's hash gave, unless a file changed
// while it was hashed (the version may then be of neither content).
func (m *Model) hashedAs(sha string) error {
	m.filesMu.Lock()
	defer m.filesMu.Unlock()
	i, is, err := m.changedFile()
	if err != nil {
		return err
	}
	if i >= 0 {
		return m.changed(i, is, "while the model was loaded")
	}
	m.hashed = sha
	return nil
}

// CheckFiles is checkFiles for liveness: a session already open keeps
// reading its weights from these files (ORT maps them on the CPU), so a
// change is not only a reason to refuse the next session but a reason to
// restart the process (internal/service fails /healthz on it). Cheap while
// nothing changed: a stat of each file.
func (m *Model) CheckFiles() error { return m.checkFiles() }

// checkFiles is nil when the model's files are those Load read, else
// ErrModelFileChanged when their bytes are no longer the version's. A
// file changed with the same bytes (touched, or the same content copied
// over it again) costs one hash of the files, which are then held as
// they are now.
//
// Why stamps, and a hash only when one moved: an in-place write changes
// what even the held descriptor reads (the same inode) and always sets
// the modification time, a file renamed over the path is another inode;
// a hash on every NewSession would cost seconds on a 1.7 GB model.
func (m *Model) checkFiles() error {
	m.filesMu.Lock()
	defer m.filesMu.Unlock()
	states, err := m.fileStates()
	if err != nil {
		return err
	}
	i := m.firstChanged(states)
	if i < 0 {
		return nil
	}
	is := states[i]
	if m.hashed == "" {
		return m.changed(i, is, "while the model was loaded")
	}
	// gpupool asks again for each batch no device can run: the files as
	// they were refused are refused again without a hash.
	if m.refused != nil && slices.Equal(states, m.refusedStates) {
		return m.refused
	}
	refused := m.changed(i, is, "since Load read it")
	refuse := func() error {
		m.refusedStates, m.refused = states, refused
		return refused
	}
	if is.removed {
		return refuse()
	}
	// The files as ORT would open them now.
	fresh := make([]heldFile, len(m.held))
	for j, h := range m.held {
		f, err := os.Open(h.real)
		var st os.FileInfo
		if err == nil {
			st, err = f.Stat()
		}
		if err != nil {
			if f != nil {
				f.Close()
			}
			closeHeld(fresh)
			return refuse()
		}
		fresh[j] = heldFile{path: h.path, real: h.real, f: f, stamp: stampOf(st)}
	}
	sha, err := hashModel(m.ONNXPath, m.dataFiles, fresh)
	if err != nil || sha != m.hashed {
		closeHeld(fresh)
		return refuse()
	}
	closeHeld(m.held)
	m.held = fresh
	// Written during the hash?
	if i, is, err := m.changedFile(); err != nil {
		return err
	} else if i >= 0 {
		return m.changed(i, is, "while it was hashed again")
	}
	return nil
}

// closeHeld closes the files of held that are open.
func closeHeld(held []heldFile) {
	for _, h := range held {
		if h.f != nil {
			h.f.Close()
		}
	}
}

// MemoryKey names what the memory of this session's runs depends on besides
// the batch's shape: the model's version (SHA256) and maximum length, the
// ONNX Runtime release, the session's options and whether the graph was
// rewritten (onnxgraph/relattn.go moves less memory). gpupool keeps CPU memory
// calibrations under it (CPUMemoryConfig.CacheDir). It is "" for a session
// whose options it cannot name (SessionOptions.Configure without a
// ConfigureKey) or whose model has no version yet (Wait has not returned):
// such a session's calibration is not kept. A CUDA session is named by its
// provider options (gpupool's GPU calibration cache).
func (s *Session) MemoryKey() string {
	if s.m.SHA256 == "" || (s.opts.Configure != nil && s.opts.ConfigureKey == "") {
		return ""
	}
	configured, configureKey := s.opts.Configure != nil, s.opts.ConfigureKey
	if s.opts.CUDA != nil {
		// The same words the CUDA provider's Configure used to be named
		// with, so GPU calibration caches written before stay valid.
		configured, configureKey = true, strings.TrimSpace(ortenv.CUDAKey(s.opts.CUDA)+" "+configureKey)
	}
	key := fmt.Sprintf("model=%s max_len=%d ort=%s intra_op=%d inter_op=%d mem_pattern=%t rewritten=%t",
		s.m.SHA256, s.m.MaxLength, ort.GetVersion(), s.opts.IntraOpThreads, s.opts.InterOpThreads, !s.opts.DisableMemPattern,
		s.m.relAttn)
	if s.opts.PadToMultipleOf > 1 {
		// Calibrated shapes run at padded lengths.
		key += fmt.Sprintf(" pad_to=%d", s.opts.PadToMultipleOf)
	}
	if s.m.relAttn {
		// Each rewrite changes what a batch allocates.
		key += " rewrites=" + s.m.rewrites
	}
	if configured {
		// The hash already tells an fp16 export from an fp32 one; the
		// output type says which to a person reading a cache file.
		key += fmt.Sprintf(" output=%v configure=%q", s.m.OutputType, configureKey)
	}
	return key
}

// ErrNoArenaShrink is returned by ReleaseArena on a session created without
// SessionOptions.ShrinkArenas.
var ErrNoArenaShrink = errors.New("model: session has no arena to shrink")

// ReleaseArena runs one minimal batch with ORT's arena-shrinkage run option,
// so the device arena hands every region no tensor holds back to the device
// at the end of the run (on the CPU, to the C heap, which is then trimmed).
// gpupool's calibration calls it between shapes so each shape's memory is
// measured from an empty arena, not on top of the previous shape's
// high-water mark.
func (s *Session) ReleaseArena(ctx context.Context) error {
	if s.opts.ShrinkArenas == "" {
		return ErrNoArenaShrink
	}
	pairs := []Pair{{IDs: []int32{int32(s.m.Tokenizer.PadID())}, TypeIDs: []int32{0}}}
	if _, err := s.ScorePairsReleasingArena(ctx, pairs); err != nil {
		return fmt.Errorf("model: releasing arena (%s): %w", s.opts.ShrinkArenas, err)
	}
	return nil
}

// PadLength is the length a batch whose longest pair has n tokens is run
// at (SessionOptions.PadToMultipleOf): what gpupool plans, admits and
// calibrates with, so its memory model sees the shapes that run.
func (s *Session) PadLength(n int) int { return padLength(n, s.opts.PadToMultipleOf, s.m.MaxLength) }

// padLength rounds n up to a multiple of k, but not past maxLen (position
// embeddings end there) unless n is already beyond it.
func padLength(n, k, maxLen int) int {
	if k <= 1 || n <= 0 {
		return n
	}
	p := (n + k - 1) / k * k
	if maxLen > 0 && p > maxLen {
		return max(n, maxLen)
	}
	return p
}

// Model is the model this session runs.
func (s *Session) Model() *Model { return s.m }

// ScorePairs returns P(entailment) for each pair under the model's
// ScoreMode, in input order. It implements PairScorer.
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
	trimMalloc() // what the arena handed back to the C heap
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

// Close destroys the ORT session after calls in flight return. Later calls
// get ErrSessionClosed; a second Close is a no-op.
func (s *Session) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	if err := s.sess.Destroy(); err != nil {
		return fmt.Errorf("model: destroying session for %s: %w", s.m.Name, err)
	}
	return nil
}

var _ PairScorer = (*Session)(nil)
