package model

import (
	"cmp"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"

	ort "github.com/yalue/onnxruntime_go"
	"google.golang.org/protobuf/proto"

	"github.com/scorer/scorer/model/onnxgraph"
	"github.com/scorer/scorer/model/onnxpb"
	"github.com/scorer/scorer/model/tokenizer"
	"github.com/scorer/scorer/schema"
)

// Graph input names the session knows how to fill. Anything else in a graph
// is an input we cannot supply, so Load rejects it rather than fail at Run.
const (
	inputIDs       = "input_ids"
	inputMask      = "attention_mask"
	inputTypeIDs   = "token_type_ids"
	outputLogits   = "logits"
	defaultMaxLen  = 512
	defaultONNX    = "model.onnx"
	onnxSubdirGlob = "onnx/model*.onnx"
)

// LoadOptions says which model folder to load and how to read its output.
type LoadOptions struct {
	// Dir is the model folder: config.json, tokenizer.json, optional
	// tokenizer_config.json and the ONNX graph.
	Dir string
	// ONNXFile is the graph relative to Dir, and inside it: an absolute
	// path or one whose ".." leaves Dir is refused. Empty means model.onnx, or else
	// the single onnx/model*.onnx (exports often ship several quantisations
	// there, so more than one is an error that lists them).
	ONNXFile string
	// Name is the model's name in results and metrics. Empty means
	// config.json's _name_or_path when it is a Hugging Face Hub id
	// (owner/name), else Dir's base name: deployments mount every model at
	// one path (/models), where the folder names nothing.
	Name string
	// EntailmentIndex overrides the class found from id2label, for models
	// whose labels are LABEL_0… or otherwise unnamed.
	EntailmentIndex *int
	// ContradictionIndex overrides the class ScoreEntailVsContradiction
	// compares against.
	ContradictionIndex *int
	// ScoreMode defaults to ScoreSoftmax.
	ScoreMode ScoreMode
	// MaxLength caps a pair's token count. 0 means the smallest of the
	// tokenizer's model_max_length, config's max_position_embeddings and 512.
	MaxLength int
	// PairEncoding defaults to EncodePair.
	PairEncoding PairEncoding
	// PairSeparator goes between premise and hypothesis under EncodeJoined;
	// empty means DefaultPairSeparator. Ignored under EncodePair.
	PairSeparator string
	// KeepRelativeAttention loads the graph as exported. False (the
	// default) rewrites DeBERTa's disentangled attention, when the graph
	// has it, to compute only the relative positions a batch can use
	// (onnxgraph/relattn.go); Model.GraphRewrite says what was done.
	KeepRelativeAttention bool
	// AttentionRewrites names the attention rewrites run after the
	// relative-attention one (onnxgraph/attention.go): comma-separated, "none" for
	// none, "" for DefaultAttentionRewrites. Ignored under
	// KeepRelativeAttention.
	AttentionRewrites string
}

// Model is a loaded NLI model: its tokenizer, label layout and graph
// description. It holds no ORT session; NewSession makes one per device, so a
// Model can be shared freely and is read-only after Load.
type Model struct {
	// Name is reported with every result: LoadOptions.Name, else a Hub id
	// in config.json's _name_or_path, else the folder's base name.
	Name string
	// Dir is the model folder.
	Dir string
	// ONNXPath is the graph file that sessions load.
	ONNXPath string
	// SHA256 is the model's version: the hex SHA-256 of config.json,
	// tokenizer.json, tokenizer_config.json and the graph's files
	// (versionPrefix, hashModel), everything Load reads that decides a
	// score.
	SHA256 string
	// Tokenizer encodes premises and hypotheses for this model.
	Tokenizer *tokenizer.Tokenizer
	// ID2Label is the class names by output index.
	ID2Label []string
	// EntailmentIndex is the output class read as P(entailment).
	EntailmentIndex int
	// ContradictionIndex is the class ScoreEntailVsContradiction compares
	// against; -1 when the model has none and that mode is not in use.
	ContradictionIndex int
	// MaxLength is the longest pair, in tokens, fed to the graph.
	MaxLength int
	// ScoreMode is how logits become P(entailment).
	ScoreMode ScoreMode
	// PairEncoding is how a (premise, hypothesis) pair becomes one input.
	PairEncoding PairEncoding
	// PairSeparator joins premise and hypothesis under EncodeJoined; ""
	// under EncodePair.
	PairSeparator string
	// InputNames are the graph inputs in the order sessions feed them.
	InputNames []string
	// OutputName is the graph output holding [rows, classes] logits.
	OutputName string
	// OutputType is that output's element type, read from the graph:
	// float32, or float16 for a graph exported for GPUs in half precision
	// (Optimum's --dtype fp16). Sessions convert float16 logits to float32.
	OutputType ort.TensorElementDataType
	// GraphRewrite says, in one line for the log, what load changed in the
	// graph sessions run, or why it changed nothing.
	GraphRewrite string

	// graph is the graph sessions load, encoded (leanGraph: its weights
	// referenced where they lie on disk), rewritten unless
	// KeepRelativeAttention; graphDir is the folder its external data
	// locations are relative to; dataFiles are the data files it reads
	// besides the graph file.
	graph     []byte
	graphDir  string
	dataFiles []string
	// held are the graph file and its data files, open since Load read
	// them (leanGraph.held). filesMu guards them, hashed, the version
	// Load's hash gave ("" until then), which NewSession compares changed
	// files against (checkFiles), and refused, checkFiles' last refusal,
	// given for the files in refusedStates.
	filesMu       sync.Mutex
	held          []heldFile
	hashed        string
	refused       error
	refusedStates []fileState
	// versionState is the version's SHA-256 state after the files Load
	// read whole (versionPrefix); hashModel continues it with the graph's
	// files, at Load and when checkFiles hashes them again.
	versionState []byte
	// hashDone is closed once Start's hash has ended, with hashed set or
	// not: a session from the graph cache waits for it to check the
	// version its entry was written for (newCachedSession).
	hashDone chan struct{}
	// relAttn is whether the relative-attention rewrite changed the graph,
	// and rewrites the attention rewrites asked for after it.
	relAttn  bool
	rewrites string
	// eosHead is the eos token id a BART-style classification head reads
	// (eoshead.go), -1 for other heads.
	eosHead int32
}

// Files are the files that hold the graph and its weights: the graph file
// and the external data files it references, if any.
func (m *Model) Files() []string {
	return append([]string{m.ONNXPath}, m.dataFiles...)
}

// Info is the identity written into every scored record.
func (m *Model) Info() schema.ModelInfo {
	return schema.ModelInfo{Name: m.Name, SHA256: m.SHA256}
}

// Load reads a model folder. The ORT environment must exist (ortenv.InitRuntime),
// because sessions made from the model run on it. Load is Start then Wait.
func Load(opts LoadOptions) (*Model, error) {
	l, err := Start(opts)
	if err != nil {
		return nil, err
	}
	return l.Wait()
}

// Loading is a model folder whose slow parts are still being read: the
// ONNX file's hash and the tokenizer. Start returns one.
//
// Why: on a production-size model hashing the 1.7 GB graph takes about a
// second and DeBERTa-v3's 128k-piece tokenizer a third of one, while ORT
// spends several seconds reading and optimising the same graph on one core
// when a session is created. Starting the sessions from Model while Wait
// is pending overlaps the two (internal/service's OpenScoring does).
type Loading struct {
	m *Model

	done chan struct{} // closed when sha, tok and loadErr are set
	sha  string
	tok  *tokenizer.Tokenizer
	// loadErr is the first error of the background work.
	loadErr error

	once    sync.Once
	waitErr error
}

// Start checks the options and reads config.json, tokenizer_config.json and
// the graph's inputs and outputs (milliseconds), rewrites DeBERTa's
// relative attention unless KeepRelativeAttention (rewriteGraph: a copy of
// the file, seconds for a production-size model), then hashes the ONNX file
// and loads the tokenizer in the background. Its errors are those of
// Load's first steps; the hash's and the tokenizer's come from Wait.
func Start(opts LoadOptions) (*Loading, error) {
	m, cfg, err := loadGraph(opts)
	if err != nil {
		return nil, err
	}
	tokMax, tokCfg, err := readModelMaxLength(filepath.Join(opts.Dir, "tokenizer_config.json"))
	if err != nil {
		closeHeld(m.held)
		return nil, err
	}
	if m.MaxLength, err = pickMaxLength(opts.MaxLength, tokMax, cfg.maxPositions); err != nil {
		closeHeld(m.held)
		return nil, err
	}
	// Read here, parsed in the background: the version covers the bytes
	// parsed (versionPrefix), and reading is milliseconds of the parse.
	tokPath := filepath.Join(opts.Dir, "tokenizer.json")
	tokJSON, err := os.ReadFile(tokPath)
	if err != nil {
		closeHeld(m.held)
		return nil, fmt.Errorf("model: loading tokenizer: %w", err)
	}
	if m.versionState, err = versionPrefix(cfg.raw, tokJSON, tokCfg); err != nil {
		closeHeld(m.held)
		return nil, err
	}
	l := &Loading{m: m, done: make(chan struct{})}
	m.hashDone = make(chan struct{})
	go func() {
		defer close(l.done)
		// Two goroutines, so that on more than two cores the hash and the
		// tokenizer overlap each other as well as the session.
		var wg sync.WaitGroup
		var tokErr error
		wg.Go(func() {
			if l.tok, tokErr = tokenizer.Parse(tokJSON); tokErr != nil {
				tokErr = fmt.Errorf("model: loading tokenizer %s: %w", tokPath, tokErr)
			}
		})
		sha, hashErr := hashModel(m.versionState, m.ONNXPath, m.dataFiles, m.held)
		if hashErr == nil {
			hashErr = m.hashedAs(sha)
		}
		close(m.hashDone)
		wg.Wait()
		l.sha, l.loadErr = sha, cmp.Or(tokErr, hashErr)
	}()
	return l, nil
}

// Model is the model being loaded, complete but for SHA256 ("") and
// Tokenizer (nil) until Wait returns: enough for NewSession, which reads
// only the graph's file and names, but a session must not run before Wait
// has returned without error (padding reads the tokenizer). Wait fills
// those two fields of this same value.
func (l *Loading) Model() *Model { return l.m }

// Wait blocks until the hash and the tokenizer are loaded and returns the
// complete model, or the first error of loading it. It may be called from
// several goroutines and more than once; every call returns the same.
func (l *Loading) Wait() (*Model, error) {
	l.once.Do(func() {
		<-l.done
		if l.loadErr != nil {
			l.waitErr = l.loadErr
			return
		}
		m := l.m
		special := l.tok.NumSpecialTokensPair()
		if m.PairEncoding == EncodeJoined {
			special = l.tok.NumSpecialTokensSingle()
		}
		if m.MaxLength <= special {
			l.waitErr = fmt.Errorf("model: max length %d leaves no room for text beside %d special tokens", m.MaxLength, special)
			return
		}
		m.SHA256, m.Tokenizer = l.sha, l.tok
		if err := m.checkEOSHead(); err != nil {
			m.Tokenizer, l.waitErr = nil, err
		}
	})
	if l.waitErr != nil {
		return nil, l.waitErr
	}
	return l.m, nil
}

// loadGraph does Start's first steps: options, labels, the ONNX file and
// its inputs and outputs. It also returns config.json as read.
func loadGraph(opts LoadOptions) (*Model, modelConfig, error) {
	if opts.Dir == "" {
		return nil, modelConfig{}, errors.New("model: LoadOptions.Dir is empty")
	}
	mode, err := ParseScoreMode(string(opts.ScoreMode))
	if err != nil {
		return nil, modelConfig{}, err
	}
	enc, err := ParsePairEncoding(string(opts.PairEncoding))
	if err != nil {
		return nil, modelConfig{}, err
	}
	if st, err := os.Stat(opts.Dir); err != nil {
		return nil, modelConfig{}, fmt.Errorf("model: model folder: %w", err)
	} else if !st.IsDir() {
		return nil, modelConfig{}, fmt.Errorf("model: model folder %s is not a directory", opts.Dir)
	}
	m := &Model{Name: filepath.Base(filepath.Clean(opts.Dir)), Dir: opts.Dir, ScoreMode: mode, PairEncoding: enc}
	if enc == EncodeJoined {
		m.PairSeparator = cmp.Or(opts.PairSeparator, DefaultPairSeparator)
	}

	cfg, err := readConfig(filepath.Join(opts.Dir, "config.json"))
	if err != nil {
		return nil, modelConfig{}, err
	}
	m.ID2Label, m.eosHead = cfg.labels, cfg.eosHead
	if opts.Name != "" {
		m.Name = opts.Name
	} else if hubID(cfg.nameOrPath) {
		m.Name = cfg.nameOrPath
	}
	if err := m.pickIndices(opts, mode); err != nil {
		return nil, modelConfig{}, err
	}
	if m.ONNXPath, err = findONNX(opts.Dir, opts.ONNXFile); err != nil {
		return nil, modelConfig{}, err
	}
	steps, err := onnxgraph.ParseSteps(opts.AttentionRewrites)
	if err != nil {
		return nil, modelConfig{}, fmt.Errorf("model: %w", err)
	}
	steps.Heads = cfg.heads
	// The graph is read once (openLeanGraph): its declarations, then what
	// sessions load.
	lg, err := openLeanGraph(m.ONNXPath)
	if err != nil {
		return nil, modelConfig{}, fmt.Errorf("model: reading graph %s: %w", m.ONNXPath, err)
	}
	if err := m.readGraph(lg.m.GetGraph()); err != nil {
		lg.close()
		return nil, modelConfig{}, err
	}
	if err := m.prepareGraph(lg, opts.KeepRelativeAttention, steps); err != nil {
		return nil, modelConfig{}, err
	}
	return m, cfg, nil
}

// prepareGraph takes the graph as sessions load it (lg, read from
// m.ONNXPath) and rewrites the disentangled attention unless told to keep
// it. A graph the rewrite does not recognise, or cannot rewrite, runs as
// exported: the reason goes to GraphRewrite, never into an error. An error
// is a graph that cannot be read again or encoded; lg's files are then
// closed.
func (m *Model) prepareGraph(lg *leanGraph, keep bool, steps onnxgraph.Steps) error {
	var err error
	if keep {
		m.GraphRewrite = "graph as exported: relative-attention rewrite off"
	} else if st, err := onnxgraph.RewriteAttention(lg.m, steps); err != nil {
		m.GraphRewrite = "graph as exported: " + err.Error()
		// A failed rewrite may have left the graph half changed.
		lg.close()
		if lg, err = openLeanGraph(m.ONNXPath); err != nil {
			return fmt.Errorf("model: reading %s: %w", m.ONNXPath, err)
		}
	} else {
		m.relAttn = true
		m.rewrites = steps.String()
		m.GraphRewrite = st.String()
	}
	// The Model holds the files for its life, as sessions may be created
	// until the process ends (os.File closes them if the Model is dropped).
	m.graphDir, m.dataFiles, m.held = lg.dir, lg.files, lg.held
	if m.graph, err = proto.Marshal(lg.m); err != nil {
		lg.close()
		return fmt.Errorf("model: encoding the graph of %s: %w", m.ONNXPath, err)
	}
	return nil
}

// readGraph fills InputNames and OutputName from the graph's declarations
// and checks that every input is one we can feed. It reads the
// declarations only (graphIO), so a malformed graph that declares them well
// still loads here and fails at NewSession.
func (m *Model) readGraph(g *onnxpb.GraphProto) error {
	ins, outs := graphIO(g)
	have := map[string]bool{}
	for _, in := range ins {
		switch in.name {
		case inputIDs, inputMask, inputTypeIDs:
		default:
			return fmt.Errorf("model: graph %s has input %q; only %s, %s and %s can be fed", m.ONNXPath, in.name, inputIDs, inputMask, inputTypeIDs)
		}
		if in.elemType != onnxInt64 {
			return fmt.Errorf("model: graph input %q is %s, want int64", in.name, ort.TensorElementDataType(in.elemType))
		}
		have[in.name] = true
		m.InputNames = append(m.InputNames, in.name)
	}
	for _, req := range []string{inputIDs, inputMask} {
		if !have[req] {
			return fmt.Errorf("model: graph %s lacks required input %q (has %v)", m.ONNXPath, req, m.InputNames)
		}
	}

	var out *graphValue
	for i := range outs {
		if outs[i].name == outputLogits {
			out = &outs[i]
		}
	}
	if out == nil {
		if len(outs) != 1 {
			names := make([]string, len(outs))
			for i, o := range outs {
				names[i] = o.name
			}
			return fmt.Errorf("model: graph %s has no %q output and %d outputs %v; cannot tell which holds logits", m.ONNXPath, outputLogits, len(outs), names)
		}
		out = &outs[0]
	}
	// ONNX's element type numbers are ORT's.
	outType := ort.TensorElementDataType(out.elemType)
	switch outType {
	case ort.TensorElementDataTypeFloat, ort.TensorElementDataTypeFloat16:
	default:
		return fmt.Errorf("model: graph output %q is %s, want float32 or float16 logits", out.name, outType)
	}
	if d := out.dims; len(d) != 2 {
		return fmt.Errorf("model: graph output %q has shape %v, want [batch, classes]", out.name, d)
	} else if d[1] > 0 && int(d[1]) != len(m.ID2Label) {
		return fmt.Errorf("model: graph output %q has %d classes but id2label has %d", out.name, d[1], len(m.ID2Label))
	}
	m.OutputName, m.OutputType = out.name, outType
	return nil
}
