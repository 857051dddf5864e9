// Package offline is `scorer score`: TranscriptEvents in (JSONL, or
// Parquet tables as the Spark job read them), ScoredTranscripts out (JSONL,
// or Parquet rows for the table the job wrote), through the same model and
// pool as the service (scoring.Open) but with no Kafka. It writes
// --out atomically, or resumably with --resume.
package offline

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/term"

	"github.com/rs/zerolog"
	"github.com/scorer/scorer/gpupool"
	"github.com/scorer/scorer/internal/cli"
	"github.com/scorer/scorer/internal/config"
	"github.com/scorer/scorer/internal/scoring"
	"github.com/scorer/scorer/schema"
)

// Spec is `scorer score` for its help and the docs.
var Spec = cli.Spec{
	Name: "score", Synopsis: "[--in FILE] [--out FILE] [flags]",
	Summary: "score a TranscriptEvent JSONL (or Parquet) file offline into ScoredTranscripts",
	About: "The offline scorer: TranscriptEvents in (JSONL, or Parquet tables as the Spark job read them), " +
		"ScoredTranscripts out in the same order (JSONL, or Parquet rows for the table the job wrote), through the " +
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
	snk, part, err := f.openSink(outFile, id, e.Stdout, log)
	if err != nil {
		return err
	}

	sj := &scoreJob{stack: stack, src: src, out: snk, stderr: e.Stderr, skipBad: f.skipBad, chunk: f.chunk, started: time.Now()}
	if part != nil {
		sj.resumeDone = part.done()
	}
	err = sj.runShowing(ctx, f.progress == "on" || (f.progress == "auto" && isTerminal(e.Stderr)))
	if err != nil && ctx.Err() != nil {
		err = fmt.Errorf("score: %w", cli.ErrInterrupted)
	}
	err = f.finish(err, snk, part, outFile, log)
	ev := log.Info().Int64("transcripts", sj.done.Load()).Int64("skipped", sj.skipped.Load()).Int64("pairs", sj.pairs.Load()).
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
	if f.in != "-" && f.out != "-" && sameFile(f.in, f.out) {
		return cli.UsageError{Msg: fmt.Sprintf("score: --in and --out are the same file (%s): the output would overwrite the input", f.out)}
	}
	return nil
}

// openSink is where results go: the partial store under --resume (part,
// with the transcripts it already holds), else Parquet rows or JSONL into
// outFile, else JSONL on stdout.
func (f *scoreFlags) openSink(outFile *outputFile, id runIdentity, stdout io.Writer, log zerolog.Logger) (sink, partialStore, error) {
	outParquet := f.out != "-" && strings.EqualFold(filepath.Ext(f.out), ".parquet")
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

// scoreJob is one `scorer score` run: a reader that decodes records into
// chunks, up to two chunks scoring at once, and a writer that keeps order.
type scoreJob struct {
	stack   *scoring.Stack
	src     source
	out     sink
	stderr  io.Writer
	skipBad bool
	chunk   int

	// resumeDone are the transcripts of the partial output, in order: the
	// first valid input transcripts, which must match them, are skipped.
	resumeDone []doneTranscript

	started  time.Time
	done     atomic.Int64
	skipped  atomic.Int64
	pairs    atomic.Int64
	bad      atomic.Int64
	stderrMu sync.Mutex
}

type scoreChunk struct {
	events []schema.TranscriptEvent
	result chan scoreResult
}

type scoreResult struct {
	scored []schema.ScoredTranscript
	err    error
}

// runShowing is run, with a progress bar on stderr while it runs when show
// is set.
func (j *scoreJob) runShowing(ctx context.Context, show bool) error {
	if show {
		stop := j.startProgress()
		defer stop()
	}
	return j.run(ctx)
}

// run returns as soon as ctx ends, even while the reader is blocked on a
// stdin that never closes: that goroutine is left behind for process exit.
func (j *scoreJob) run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // stops the reader and the scoring calls in flight
	// The buffer of 1 plus the chunk being written bounds memory to a few chunks.
	chunks := make(chan *scoreChunk, 1)
	readErr := make(chan error, 1)
	go func() {
		defer close(chunks)
		readErr <- j.read(ctx, chunks)
	}()
	for {
		var c *scoreChunk
		select {
		case c = <-chunks:
		case <-ctx.Done():
			return ctx.Err()
		}
		if c == nil { // the reader is done; every chunk it sent is written
			return <-readErr
		}
		var res scoreResult
		select {
		case res = <-c.result:
		case <-ctx.Done():
			return ctx.Err()
		}
		if res.err != nil {
			return res.err
		}
		if err := j.out.write(res.scored); err != nil {
			return fmt.Errorf("score: write: %w", err)
		}
		// --resume: the chunk reaches the disk before the next is written,
		// so a crash loses at most the chunks in flight.
		if err := j.out.checkpoint(); err != nil {
			return fmt.Errorf("score: write: %w", err)
		}
		j.done.Add(int64(len(res.scored)))
	}
}

// read decodes records into chunks and starts scoring each chunk as soon as
// it is full, so tokenizing and inference overlap with reading.
func (j *scoreJob) read(ctx context.Context, chunks chan<- *scoreChunk) error {
	var events []schema.TranscriptEvent
	send := func() error {
		if len(events) == 0 {
			return nil
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		c := &scoreChunk{events: events, result: make(chan scoreResult, 1)}
		events = nil
		for _, ev := range c.events {
			j.pairs.Add(int64(j.stack.Scorer.PairCount(&ev)))
		}
		go func() {
			scored, err := j.stack.Scorer.Score(ctx, c.events)
			c.result <- scoreResult{scored: scored, err: err}
		}()
		select {
		case chunks <- c:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	valid := 0 // valid transcripts read so far
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		rec, err := j.src.next()
		if errors.Is(err, io.EOF) {
			if valid < len(j.resumeDone) {
				return fmt.Errorf("score: --resume: the input has %d transcripts but the partial output already holds %d: the input changed since the interrupted run (remove the .partial output to start over)",
					valid, len(j.resumeDone))
			}
			return send()
		}
		if err != nil {
			if serr := send(); serr != nil {
				return serr
			}
			return fmt.Errorf("score: %w", err)
		}
		var event schema.TranscriptEvent
		derr := rec.err
		if derr == nil {
			event, derr = schema.DecodeEvent(rec.data, j.stack.Limits)
		}
		switch {
		case derr == nil && valid < len(j.resumeDone):
			// Already in the partial output. It is a prefix of the output
			// in input order, so the transcript at this position must be
			// the one scored, or the input changed.
			if want := j.resumeDone[valid]; !want.matches(&event) {
				return fmt.Errorf("score: --resume: %s is call_id %q with %s, but the partial output's transcript %d is %q with %s: the input changed since the interrupted run (remove the .partial output to start over)",
					rec.where, event.CallID, sectionCounts(&event), valid+1, want.CallID, show(want.Sections))
			}
			valid++
			j.skipped.Add(1)
		case derr == nil:
			valid++
			events = append(events, event)
		case j.skipBad:
			j.bad.Add(1)
			j.reportBad(rec, derr)
		default:
			// The valid records before this one still get scored and
			// written (stdout keeps exactly them; a file is dropped).
			if serr := send(); serr != nil {
				return serr
			}
			return fmt.Errorf("score: %s: %w", rec.where, derr)
		}
		if len(events) >= j.chunk {
			if serr := send(); serr != nil {
				return serr
			}
		}
	}
}

// sectionCounts is an event's sentences per section, as JSON.
func sectionCounts(ev *schema.TranscriptEvent) string {
	m := make(map[string]int, len(ev.Sections))
	for name, s := range ev.Sections {
		m[name] = len(s)
	}
	return show(m)
}

// reportBad writes one JSON record per skipped line or row on stderr:
// where it was ("line", or "file" and "row"), the error and its reason.
func (j *scoreJob) reportBad(r record, err error) {
	rec := map[string]any{"error": err.Error()}
	for k, v := range r.report {
		rec[k] = v
	}
	var de *schema.DecodeError
	if errors.As(err, &de) {
		rec["reason"] = de.Reason.String()
	}
	b, _ := json.Marshal(rec)
	j.stderrMu.Lock()
	defer j.stderrMu.Unlock()
	fmt.Fprintf(j.stderr, "%s\n", b)
}

// startProgress redraws one status line on stderr twice a second.
func (j *scoreJob) startProgress() func() {
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(500 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-stop:
				j.drawProgress(true)
				return
			case <-t.C:
				j.drawProgress(false)
			}
		}
	}()
	return func() { close(stop); wg.Wait() }
}

func (j *scoreJob) drawProgress(final bool) {
	elapsed := time.Since(j.started)
	done := j.done.Load()
	stats := j.stack.Pool.Stats()
	rate := float64(stats.Pairs) / max(elapsed.Seconds(), 1e-9)
	line := fmt.Sprintf("\r%d transcripts scored, %d pairs, %.0f pairs/s, %s", done, stats.Pairs, rate, elapsed.Truncate(time.Second))
	if frac := j.src.progress(); frac > 0 && !final {
		// Reading runs at most a few chunks ahead, so the input read tracks progress.
		eta := time.Duration(float64(elapsed) * (1 - frac) / frac)
		line += fmt.Sprintf(", %3.0f%%, ETA %s", 100*frac, eta.Truncate(time.Second))
	}
	if skipped := j.skipped.Load(); skipped > 0 {
		line += fmt.Sprintf(", %d skipped (done before --resume)", skipped)
	}
	if bad := j.bad.Load(); bad > 0 {
		line += fmt.Sprintf(", %d bad records", bad)
	}
	if len(stats.GPUBusy) > 0 {
		line += ", GPU busy " + busyText(stats.GPUBusy)
	}
	j.stderrMu.Lock()
	defer j.stderrMu.Unlock()
	fmt.Fprintf(j.stderr, "%s\x1b[K", line)
	if final {
		fmt.Fprintln(j.stderr)
	}
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// busyText says how busy each GPU was over the run, "cuda:0 87%", so a run
// shows how much of its time the GPU sat idle (tokenising, copies, waiting
// for a batch). A GPU with no reading yet, or one NVML cannot read (MIG),
// says so rather than 0%.
func busyText(busy []gpupool.GPUBusy) string {
	parts := make([]string, len(busy))
	for i, b := range busy {
		r, ok := b.Ratio()
		switch {
		case ok:
			parts[i] = fmt.Sprintf("%s %.0f%%", b.Device.Label(), 100*r)
		case b.Unsupported:
			parts[i] = b.Device.Label() + " not readable (NVML)"
		default:
			parts[i] = b.Device.Label() + " not sampled yet"
		}
	}
	return strings.Join(parts, ", ")
}
