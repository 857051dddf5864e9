package compare

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"

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

// Command is `scorer compare`: flags only; the work is in Score and
// Compare. Each side is loaded, scored and closed before the next,
// so two large models never share the memory.
func Command(ctx context.Context, e cli.Env, args []string) error {
	fs := flag.NewFlagSet("compare", flag.ContinueOnError)
	fs.SetOutput(e.Stderr)
	a := fs.String("a", "", "model folder of side A (default MODEL_DIR)")
	b := fs.String("b", "", "model folder of side B (default: the same as A)")
	aFile := fs.String("a-file", "", "ONNX file of A relative to its folder (default MODEL_FILE, else model.onnx)")
	bFile := fs.String("b-file", "", "ONNX file of B relative to its folder, e.g. onnx/model_quantized.onnx (default MODEL_FILE, else model.onnx)")
	aDev := fs.String("a-device", "", "DEVICE for A: auto, cpu or cuda (default DEVICE)")
	bDev := fs.String("b-device", "", "DEVICE for B (default DEVICE)")
	aEnc := fs.String("a-pair-encoding", "", "PAIR_ENCODING for A: pair or joined (default PAIR_ENCODING)")
	bEnc := fs.String("b-pair-encoding", "", "PAIR_ENCODING for B, e.g. joined against A's pair on one model to see what moves (default PAIR_ENCODING)")
	in := fs.String("in", "", "TranscriptEvent JSONL sample (required)")
	limit := fs.Int("limit", 0, "score at most this many transcripts of --in; 0 = all")
	minAgree := fs.Float64("min-agreement", 0.99, "exit 1 when any label's decision agreement at THRESHOLD is below this (0 to 1)")
	flips := fs.Int("flips", 5, "flipped sentences to list")
	asJSON := fs.Bool("json", false, "print the report as JSON")
	cfg, err := config.Load(e.Getenv, fs, args)
	if err != nil {
		return cli.UsageOr(err)
	}
	if *in == "" {
		return cli.UsageError{Msg: "compare: --in is required"}
	}
	if *limit < 0 || *flips < 0 || !(*minAgree >= 0 && *minAgree <= 1) {
		return cli.UsageError{Msg: "compare: --limit and --flips must be >= 0, --min-agreement in [0, 1]"}
	}
	log, err := cli.NewLogger(e.Stderr, cfg.LogLevel, cfg.LogFormat)
	if err != nil {
		return err
	}
	sides := [2]config.Config{cfg, cfg}
	for i, s := range []struct{ dir, file, dev, enc *string }{{a, aFile, aDev, aEnc}, {b, bFile, bDev, bEnc}} {
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
		// Each side scores everything itself: a cache would make the
		// second side's throughput meaningless.
		sides[i].ScoreCacheBytes = 0
		if err := sides[i].Validate(); err != nil {
			return err
		}
	}

	f, err := os.Open(*in)
	if err != nil {
		return fmt.Errorf("compare: %w", err)
	}
	events, err := ReadEvents(f, cfg.Limits(), *limit)
	f.Close()
	if err != nil {
		return err
	}

	shutdownORT, err := scoring.InitORT(cfg.ORTLib)
	if err != nil {
		return err
	}
	defer shutdownORT()

	var runs [2]Run
	for i, sc := range sides {
		if runs[i], err = compareSide(ctx, sc, log, events); err != nil {
			if ctx.Err() != nil {
				return fmt.Errorf("compare: %w", cli.ErrInterrupted)
			}
			return err
		}
		log.Info().Str("side", string(rune('A'+i))).Str("name", runs[i].Name).Int("pairs", runs[i].Pairs).
			Float64("seconds", runs[i].Seconds).Msg("side scored")
	}
	rep, err := Compare(runs[0], runs[1], Options{Threshold: cfg.Threshold, MinAgreement: *minAgree, Flips: *flips})
	if err != nil {
		return err
	}
	if *asJSON {
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

// compareSide opens one side's scoring stack, scores the sample and closes
// the stack again.
func compareSide(ctx context.Context, cfg config.Config, log zerolog.Logger, events []schema.TranscriptEvent) (Run, error) {
	m, err := scoring.LoadModel(cfg)
	if err != nil {
		return Run{}, err
	}
	pool, closeNVML, err := scoring.NewPool(ctx, cfg, m, log, nil, nil)
	if err != nil {
		return Run{}, err
	}
	defer closeNVML()
	defer pool.Close(context.Background())
	ts, err := model.NewTranscriptScorer(m, cfg.LabelConfig(), pool)
	if err != nil {
		return Run{}, err
	}
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
	return Score(ctx, name, ts, events, 8)
}
