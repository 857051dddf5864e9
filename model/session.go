package model

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"

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
	// GraphCacheTrusted loads GraphCache's entries whoever wrote them, and
	// writes them with the modes the umask leaves, for a folder shared by
	// users who trust each other. False loads only what no user but the
	// process's own (or root) can have written, and writes folders and
	// files writable by their owner only: an entry's checksums are its own
	// manifest's, so whoever can write it decides the graph and weights
	// the session runs (optcache.go, untrustedFile).
	GraphCacheTrusted bool
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

// NewSession creates an ORT session for the model's graph. It refuses
// with ErrModelFileChanged when a model file changed since Load read it.
func (m *Model) NewSession(opts SessionOptions) (*Session, error) {
	if opts.IntraOpThreads < 0 || opts.InterOpThreads < 0 {
		return nil, fmt.Errorf("model: negative thread count (intra %d, inter %d)", opts.IntraOpThreads, opts.InterOpThreads)
	}
	if err := m.checkFiles(); err != nil {
		return nil, err
	}
	// Loading holds the file's protobuf beside the weights and, on CPU,
	// packs every weight; release hands that memory back once free.
	release := ortenv.SessionHeap()
	sess, cache, err := m.createSession(opts)
	release()
	if err != nil {
		return nil, err
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
	return &Session{m: m, sess: sess, opts: opts, cache: cache}, nil
}

// createSession creates ORT's session from the graph cache where it can,
// else from the model's graph.
func (m *Model) createSession(opts SessionOptions) (*ort.DynamicAdvancedSession, GraphCacheResult, error) {
	var cache GraphCacheResult
	if key := sessionOpts(opts).graphCacheKey(m); opts.GraphCache != "" && opts.CUDA == nil && key != "" {
		so, err := m.sessionOptions(opts)
		if err != nil {
			return nil, cache, err
		}
		sess, res := m.newCachedSession(opts, key, so)
		so.Destroy()
		if sess != nil {
			return sess, res, nil
		}
		cache = res
	}
	sess, err := m.newPlainSession(opts)
	return sess, cache, err
}

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
