// Package offline is `scorer score`: TranscriptEvents in (JSONL, or
// Parquet tables as the Spark job read them), ScoredTranscripts out (JSONL,
// or Parquet rows for the table the job wrote), through the same model and
// pool as the service (scoring.Open) but with no Kafka. It writes
// --out atomically, or resumably with --resume.
package offline

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"time"

	"github.com/rs/zerolog"
	"github.com/scorer/scorer/internal/cli"
	"github.com/scorer/scorer/internal/config"
	"github.com/scorer/scorer/internal/scoring"
)

// Spec is `scorer score` for its help and the docs.
var Spec = cli.Spec{
	Name: "score", Synopsis: "[--in FILE] [--out FILE] [flags]",
	Summary: "score a TranscriptEvent JSONL (or Parquet) file offline into ScoredTranscripts",
	About: "The offline scorer: TranscriptEvents in (JSONL, or Parquet tables as the Spark job read them), " +
		"ScoredTranscripts out in the same order (JSONL), or Parquet rows of each key's newest version (OUTPUT_KEY, " +
		"greatest version_id) for the table the job wrote, through the " +
		"service's model and pool, no Kafka. A file --out appears only when the run succeeds; --resume keeps " +
		"finished transcripts so an interrupted backfill continues. SIGINT/SIGTERM stops at once, exit 130.",
	Settings: config.Score,
	Flags:    func(fs *flag.FlagSet) { new(scoreFlags).register(fs) },
}

// scoreFlags are `scorer score`'s own flags.
type scoreFlags struct {
	in, out, model, progress string
	skipBad, resume          bool
	chunk                    int
}

func (f *scoreFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.in, "in", "-", "TranscriptEvent JSONL file (- = stdin), or Parquet: a .parquet file or a directory of part files")
	fs.StringVar(&f.out, "out", "-", "ScoredTranscript JSONL file (- = stdout), or a .parquet file of rows; written to a temporary file beside it and renamed over it only when the run succeeds")
	fs.StringVar(&f.model, "model", "", "model folder (overrides MODEL_DIR / --model-dir)")
	fs.BoolVar(&f.skipBad, "skip-bad", false, "report bad lines (or Parquet rows) on stderr as JSON and go on, instead of stopping")
	fs.IntVar(&f.chunk, "chunk", 8, "transcripts per scoring call; two calls are in flight so reading overlaps scoring")
	fs.StringVar(&f.progress, "progress", "auto", "progress bar on stderr: auto (when stderr is a terminal), on, or off")
	fs.BoolVar(&f.resume, "resume", false, "keep completed transcripts in <out>.partial (durable as they complete) with the settings that scored them; a later --resume run with the same settings skips them and appends the rest, and makes --out at the end")
}

// Command is `scorer score`, the offline scorer: TranscriptEvents in,
// ScoredTranscripts out, same order, through the same scoring stack as the
// service. --in is JSONL (a file, or - for stdin) or Parquet (a .parquet
// file, or a directory of part files as Spark writes them); --out is JSONL
// (a file, or - for stdout) or, for a .parquet name, Parquet rows: one per
// (call, section, sentence, label) with the rows topic's columns.
// A file --out appears only when the whole run succeeds. When ctx ends (the
// first SIGINT/SIGTERM) it stops at once with cli.ErrInterrupted, even while
// waiting on stdin. With --resume, completed transcripts are kept in
// <out>.partial (made durable as they complete) with a record of what
// scored them, and a later --resume run under the same settings skips them
// and appends the rest, so a long backfill never starts over.
func Command(ctx context.Context, e cli.Env, args []string) error {
	fs := Spec.FlagSet(e)
	var f scoreFlags
	f.register(fs)
	cfg, err := Spec.Load(e, fs, args)
	if err != nil {
		return err
	}
	if f.model != "" {
		cfg.ModelDir = f.model
	}
	if err := f.check(); err != nil {
		return err
	}
	log, err := cli.NewLogger(e.Stderr, cfg.LogLevel, cfg.LogFormat)
	if err != nil {
		return err
	}

	src, err := openSource(f.in, e.Stdin)
	if err != nil {
		return fmt.Errorf("score: %w", err)
	}
	defer src.close()
	var outFile *outputFile // a plain (not --resume) file --out
	if f.out != "-" && !f.resume {
		if outFile, err = createOutput(f.out); err != nil {
			return fmt.Errorf("score: %w", err)
		}
		defer outFile.abort() // a no-op after commit; covers every failure
	}

	stack, err := openStack(ctx, cfg, log, nil)
	if err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("score: %w", cli.ErrInterrupted)
		}
		return err
	}
	defer stack.Close(context.Background())
	id, err := identityOf(stack.Model, stack.Labels, cfg)
	if err != nil {
		return fmt.Errorf("score: %w", err)
	}
	var key versionKey
	var replaced map[int]struct{}
	if f.outParquet() {
		// Rows are keyed, so they hold each key's newest version only.
		id.OutputKey = cfg.OutputKey
		key = keyOf(cfg.OutputKey)
		if replaced, err = f.superseded(ctx, key, stack); err != nil {
			if ctx.Err() != nil {
				return fmt.Errorf("score: %w", cli.ErrInterrupted)
			}
			return fmt.Errorf("score: finding each key's newest version: %w", err)
		}
	}
	snk, part, err := f.openSink(outFile, id, e.Stdout, log)
	if err != nil {
		return err
	}

	sj := &scoreJob{stack: stack, src: src, out: snk, stderr: e.Stderr, skipBad: f.skipBad, chunk: f.chunk, started: time.Now(),
		key: key, replaced: replaced}
	if part != nil {
		sj.resumeDone = part.done()
	}
	err = sj.runShowing(ctx, f.progress == "on" || (f.progress == "auto" && isTerminal(e.Stderr)))
	if err != nil && ctx.Err() != nil {
		err = fmt.Errorf("score: %w", cli.ErrInterrupted)
	}
	err = f.finish(err, snk, part, outFile, log)
	ev := log.Info().Int64("transcripts", sj.done.Load()).Int64("skipped", sj.skipped.Load()).Int64("older_versions", sj.older.Load()).Int64("pairs", sj.pairs.Load()).
		Int64("bad_records", sj.bad.Load()).Dur("elapsed", time.Since(sj.started))
	if busy := stack.Pool.Stats().GPUBusy; len(busy) > 0 {
		// Only a GPU run gets the field: a CPU run has no GPU to be idle.
		ev = ev.Str("gpu_busy", busyText(busy))
	}
	ev.Msg("score finished")
	return err
}

// openStack is scoring.Open, which Command builds its stack with. It is a
// variable only so that tests can hand each run a model loaded once per
// test process (scoring.WithModel) instead of loading the same folder again
// at every run; nothing else sets it.
var openStack = scoring.Open

// check refuses flag combinations that cannot work.
func (f *scoreFlags) check() error {
	if f.chunk <= 0 {
		return errors.New("score: --chunk must be > 0")
	}
	if f.resume && f.out == "-" {
		return cli.UsageError{Msg: "score: --resume needs --out FILE (the partial output is kept beside it)"}
	}
	if f.in == "-" && f.outParquet() {
		return cli.UsageError{Msg: "score: Parquet rows need --in FILE, not stdin: they hold each key's newest version only, which takes reading the input twice"}
	}
	if f.in != "-" && f.out != "-" && sameFile(f.in, f.out) {
		return cli.UsageError{Msg: fmt.Sprintf("score: --in and --out are the same file (%s): the output would overwrite the input", f.out)}
	}
	return nil
}

// outParquet says whether --out is a Parquet file of rows.
func (f *scoreFlags) outParquet() bool {
	return f.out != "-" && strings.EqualFold(filepath.Ext(f.out), ".parquet")
}

// superseded reads --in a first time for the versions that a newer one
// of their key replaces (see versions.go).
func (f *scoreFlags) superseded(ctx context.Context, key versionKey, stack *scoring.Stack) (map[int]struct{}, error) {
	src, err := openSource(f.in, nil)
	if err != nil {
		return nil, err
	}
	defer src.close()
	return superseded(ctx, src, key, stack.Limits)
}

// openSink is where results go: the partial store under --resume (part,
// with the transcripts it already holds), else Parquet rows or JSONL into
// outFile, else JSONL on stdout.
func (f *scoreFlags) openSink(outFile *outputFile, id runIdentity, stdout io.Writer, log zerolog.Logger) (sink, partialStore, error) {
	outParquet := f.outParquet()
	switch {
	case f.resume:
		part, err := openPartial(f.out, outParquet, id)
		if err != nil {
			return nil, nil, fmt.Errorf("score: --resume: %w", err)
		}
		if n := len(part.done()); n > 0 {
			log.Info().Str("partial", part.path()).Int("transcripts", n).Msg("resuming: these are kept and skipped")
		}
		return part, part, nil
	case outParquet:
		return newParquetSink(outFile.f, id.json()), nil, nil
	case outFile != nil:
		return newJSONLSink(outFile.f), nil, nil
	}
	return newJSONLSink(stdout), nil, nil
}

// finish settles the output after a run that ended with err: under
// --resume the partial becomes --out, or is kept for the next run; a file
// --out appears only when everything succeeded; on stdout the lines scored
// so far still go out.
func (f *scoreFlags) finish(err error, snk sink, part partialStore, outFile *outputFile, log zerolog.Logger) error {
	switch {
	case part != nil && err == nil:
		if cerr := part.commit(); cerr != nil {
			err = fmt.Errorf("score: %s: %w", f.out, cerr)
		}
	case part != nil:
		if kerr := part.keep(); kerr == nil {
			log.Warn().Str("partial", part.path()).Int("transcripts", len(part.done())).
				Msg("kept the completed transcripts; run again with --resume to finish")
		} else {
			log.Error().Err(kerr).Str("partial", part.path()).Msg("could not keep the completed transcripts")
		}
	default:
		if ferr := snk.finish(); err == nil && ferr != nil {
			err = fmt.Errorf("score: write: %w", ferr)
		}
		if outFile != nil && err == nil {
			if cerr := outFile.commit(); cerr != nil {
				err = fmt.Errorf("score: %s: %w", f.out, cerr)
			}
		}
	}
	return err
}
