package compare

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"github.com/rs/zerolog"

	"github.com/scorer/scorer/internal/cli"
	"github.com/scorer/scorer/internal/config"
	"github.com/scorer/scorer/internal/scoring"
	"github.com/scorer/scorer/model"
	"github.com/scorer/scorer/schema"
)

// ErrBelowAgreement is a comparison that ran but whose agreement is below
// --min-agreement: exit 1 with the report printed.
var ErrBelowAgreement = errors.New("compare: agreement below --min-agreement")

// Spec is `scorer compare` for its help and the docs.
var Spec = cli.Spec{
	Name: "compare", Synopsis: "--in FILE [--a DIR] [--b DIR] [flags]",
	Summary: "score a sample with two models (or ONNX files, devices, pair encodings) and gate on agreement",
	About: "Score one TranscriptEvent sample with two sides, each a model folder, ONNX file, DEVICE or " +
		"PAIR_ENCODING (by default both the configured one), and report per label the score differences and how " +
		"often the decisions at THRESHOLD agree, flipped sentences and each side's speed. Exit 1 when any label's " +
		"agreement is below --min-agreement: a gate for an int8, fp16 or new model before rollout. Each side is " +
		"loaded, scored and closed before the next, without the score cache.",
	Settings: config.Compare,
	Flags:    func(fs *flag.FlagSet) { new(compareFlags).register(fs) },
}

// compareFlags are `scorer compare`'s own flags.
type compareFlags struct {
	a, b, aFile, bFile, aDev, bDev, aEnc, bEnc, aRw, bRw, in string
	limit, flips                                             int
	minAgree                                                 float64
	asJSON                                                   bool
}

func (f *compareFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.a, "a", "", "model folder of side A (default MODEL_DIR)")
	fs.StringVar(&f.b, "b", "", "model folder of side B (default: the same as A)")
	fs.StringVar(&f.aFile, "a-file", "", "ONNX file of A relative to its folder (default MODEL_FILE, else model.onnx)")
	fs.StringVar(&f.bFile, "b-file", "", "ONNX file of B relative to its folder, e.g. onnx/model_quantized.onnx (default MODEL_FILE, else model.onnx)")
	fs.StringVar(&f.aDev, "a-device", "", "DEVICE for A: auto, cpu or cuda (default DEVICE)")
	fs.StringVar(&f.bDev, "b-device", "", "DEVICE for B (default DEVICE)")
	fs.StringVar(&f.aEnc, "a-pair-encoding", "", "PAIR_ENCODING for A: pair or joined (default PAIR_ENCODING)")
	fs.StringVar(&f.bEnc, "b-pair-encoding", "", "PAIR_ENCODING for B, e.g. joined against A's pair on one model to see what moves (default PAIR_ENCODING)")
	fs.StringVar(&f.aRw, "a-rel-attention-rewrite", "", "REL_ATTENTION_REWRITE for A: true or false (default REL_ATTENTION_REWRITE)")
	fs.StringVar(&f.bRw, "b-rel-attention-rewrite", "", "REL_ATTENTION_REWRITE for B, e.g. false against A's true to check the rewrite (default REL_ATTENTION_REWRITE)")
	fs.StringVar(&f.in, "in", "", "TranscriptEvent JSONL sample (required)")
	fs.IntVar(&f.limit, "limit", 0, "score at most this many transcripts of --in; 0 = all")
	fs.Float64Var(&f.minAgree, "min-agreement", 0.99, "exit 1 when any label's decision agreement at THRESHOLD is below this (0 to 1)")
	fs.IntVar(&f.flips, "flips", 5, "flipped sentences to list")
	fs.BoolVar(&f.asJSON, "json", false, "print the report as JSON")
}

// Command is `scorer compare`: flags only; the work is in Score and
// Compare. Each side is loaded, scored and closed before the next,
// so two large models never share the memory.
func Command(ctx context.Context, e cli.Env, args []string) error {
	fs := Spec.FlagSet(e)
	var f compareFlags
	f.register(fs)
	cfg, err := Spec.Load(e, fs, args)
	if err != nil {
		return err
	}
	if f.in == "" {
		return cli.UsageError{Msg: "compare: --in is required"}
	}
	if f.limit < 0 || f.flips < 0 || !(f.minAgree >= 0 && f.minAgree <= 1) {
		return cli.UsageError{Msg: "compare: --limit and --flips must be >= 0, --min-agreement in [0, 1]"}
	}
	log, err := cli.NewLogger(e.Stderr, cfg.LogLevel, cfg.LogFormat)
	if err != nil {
		return err
	}
	sides := [2]config.Config{cfg, cfg}
	for i, s := range []struct{ dir, file, dev, enc, rw *string }{{&f.a, &f.aFile, &f.aDev, &f.aEnc, &f.aRw}, {&f.b, &f.bFile, &f.bDev, &f.bEnc, &f.bRw}} {
		if *s.dir != "" {
			sides[i].ModelDir = *s.dir
		} else if i == 1 {
			sides[1].ModelDir = sides[0].ModelDir
		}
		if *s.file != "" {
			sides[i].ModelFile = *s.file
		}
		if *s.dev != "" {
			sides[i].Device = *s.dev
		}
		if *s.enc != "" {
			sides[i].PairEncoding = *s.enc
		}
		if *s.rw != "" {
			on, err := strconv.ParseBool(*s.rw)
			if err != nil {
				return cli.UsageError{Msg: fmt.Sprintf("compare: --%c-rel-attention-rewrite %q: want true or false", 'a'+i, *s.rw)}
			}
			sides[i].RelAttnRewrite = on
		}
		if err := sides[i].Validate(); err != nil {
			return err
		}
	}

	file, err := os.Open(f.in)
	if err != nil {
		return fmt.Errorf("compare: %w", err)
	}
	events, err := ReadEvents(file, cfg.Limits(), f.limit)
	file.Close()
	if err != nil {
		return err
	}

	// One runtime for both sides: ONNX Runtime is started once per process.
	rt, err := scoring.StartRuntime(cfg.ORTLib, log)
	if err != nil {
		return err
	}
	defer rt.Close()

	var runs [2]Run
	for i, sc := range sides {
		if runs[i], err = compareSide(ctx, rt, sc, log, events); err != nil {
			if ctx.Err() != nil {
				return fmt.Errorf("compare: %w", cli.ErrInterrupted)
			}
			return err
		}
		log.Info().Str("side", string(rune('A'+i))).Str("name", runs[i].Name).Int("pairs", runs[i].Pairs).
			Float64("seconds", runs[i].Seconds).Msg("side scored")
	}
	rep, err := Compare(runs[0], runs[1], Options{Threshold: cfg.Threshold, MinAgreement: f.minAgree, Flips: f.flips})
	if err != nil {
		return err
	}
	if f.asJSON {
		enc := json.NewEncoder(e.Stdout)
		enc.SetIndent("", "  ")
		err = enc.Encode(rep)
	} else {
		err = rep.WriteText(e.Stdout)
	}
	if err != nil {
		return fmt.Errorf("compare: write: %w", err)
	}
	if !rep.Pass {
		return ErrBelowAgreement
	}
	return nil
}

// compareSide opens one side's scoring stack on rt, scores the sample and
// closes the stack again. Each side scores everything itself (NoCache): a
// cache would make the second side's throughput meaningless.
func compareSide(ctx context.Context, rt *scoring.Runtime, cfg config.Config, log zerolog.Logger, events []schema.TranscriptEvent) (Run, error) {
	stack, err := openStack(ctx, cfg, log, nil, scoring.OnRuntime(rt), scoring.NoCache())
	if err != nil {
		return Run{}, err
	}
	defer stack.Close(context.Background())
	m, pool, ts := stack.Model, stack.Pool, stack.Scorer
	// One short untimed call first, so neither side's throughput carries
	// the sessions' first-run set-up.
	warm := events[0]
	warm.Sections = map[string][]string{}
	for name, sents := range events[0].Sections {
		warm.Sections[name] = sents[:min(len(sents), 4)]
	}
	if _, err := ts.Score(ctx, []schema.TranscriptEvent{warm}); err != nil {
		return Run{}, fmt.Errorf("compare: warm-up: %w", err)
	}
	rel, err := filepath.Rel(m.Dir, m.ONNXPath)
	if err != nil {
		rel = m.ONNXPath
	}
	devs := ""
	for i, d := range pool.Devices() {
		if i > 0 {
			devs += ","
		}
		devs += d.Label()
	}
	enc := string(m.PairEncoding)
	if m.PairEncoding == model.EncodeJoined {
		enc = fmt.Sprintf("%s %q", enc, m.PairSeparator)
	}
	name := fmt.Sprintf("%s/%s on %s (sha256 %.12s, %s encoding)", m.Name, rel, devs, m.SHA256, enc)
	r, err := ScoreTranscripts(ctx, name, ts, events, 8)
	r.GraphRewrite = m.GraphRewrite
	return r, err
}

// openStack is scoring.Open, which compareSide builds each side's stack
// with. It is a variable only so that tests can hand each side a model
// loaded once per test process (scoring.WithModel) instead of loading the
// same folder again at every run; nothing else sets it.
var openStack = scoring.Open
