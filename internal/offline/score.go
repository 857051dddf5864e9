// Package offline is `scorer score`: TranscriptEvent JSONL in,
// ScoredTranscript JSONL out, through the same model and pool as the
// service (service.OpenScoring) but with no Kafka. It writes --out
// atomically, or resumably with --resume.
package offline

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/term"

	"github.com/scorer/scorer/internal/service"
	"github.com/scorer/scorer/schema"
)

// Run is `scorer score`, the offline scorer: TranscriptEvent JSONL in, ScoredTranscript
// JSONL out, same order, through the same scoring stack as the service.
// A file --out appears only when the whole run succeeds. When ctx ends (the
// first SIGINT/SIGTERM) it stops at once with service.ErrInterrupted, even while
// waiting on stdin. With --resume, completed transcripts are kept in
// <out>.partial (fsynced as they complete), and a later --resume run skips
// them and appends the rest, so a long backfill never starts over.
func Run(ctx context.Context, e service.Env, args []string) error {
	fs := flag.NewFlagSet("score", flag.ContinueOnError)
	fs.SetOutput(e.Stderr)
	in := fs.String("in", "-", "TranscriptEvent JSONL file; - = stdin")
	out := fs.String("out", "-", "ScoredTranscript JSONL file, written to a temporary file beside it and renamed over it only when the run succeeds; - = stdout")
	modelDir := fs.String("model", "", "model folder (overrides MODEL_DIR / --model-dir)")
	skipBad := fs.Bool("skip-bad", false, "report bad lines on stderr as JSON and go on, instead of stopping")
	chunk := fs.Int("chunk", 8, "transcripts per scoring call; two calls are in flight so reading overlaps scoring")
	progress := fs.String("progress", "auto", "progress bar on stderr: auto (when a terminal), on, off")
	resume := fs.Bool("resume", false, "keep completed transcripts in <out>.partial (fsynced as they complete); a later --resume run skips them and appends the rest, and renames it to --out at the end")
	var outFile *outputFile
	cfg, err := service.LoadConfig(e.Getenv, fs, args)
	if err != nil {
		return service.UsageOr(err)
	}
	if *modelDir != "" {
		cfg.ModelDir = *modelDir
	}
	if *chunk <= 0 {
		return errors.New("score: --chunk must be > 0")
	}
	if *resume && *out == "-" {
		return service.UsageError{Msg: "score: --resume needs --out FILE (the partial output is kept beside it)"}
	}
	if *in != "-" && *out != "-" && sameFile(*in, *out) {
		return service.UsageError{Msg: fmt.Sprintf("score: --in and --out are the same file (%s): the output would overwrite the input", *out)}
	}
	log, err := service.NewLogger(e.Stderr, cfg.LogLevel, cfg.LogFormat)
	if err != nil {
		return err
	}

	r, total, closeIn, err := service.OpenInput(*in, e.Stdin) // total: input bytes, for the ETA
	if err != nil {
		return fmt.Errorf("score: %w", err)
	}
	defer closeIn()
	var w io.Writer = e.Stdout
	var done []string // call_ids already in the partial output, in order
	switch {
	case *resume:
		o, ids, err := openPartial(*out)
		if err != nil {
			return fmt.Errorf("score: %w", err)
		}
		defer o.abort() // keeps the partial file: that is the point
		w, outFile, done = o.f, o, ids
		if len(ids) > 0 {
			log.Info().Str("partial", o.f.Name()).Int("transcripts", len(ids)).Msg("resuming: these are kept and skipped")
		}
	case *out != "-":
		o, err := createOutput(*out)
		if err != nil {
			return fmt.Errorf("score: %w", err)
		}
		defer o.abort() // a no-op after commit; covers every failure
		w = o.f
		outFile = o
	}

	stack, err := service.OpenScoring(ctx, cfg, log, nil)
	if err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("score: %w", service.ErrInterrupted)
		}
		return err
	}
	defer stack.Close(context.Background())

	bw := bufio.NewWriterSize(w, 1<<20)
	sj := &scoreJob{
		stack: stack, in: bufio.NewReaderSize(r, 1<<20), out: bw, stderr: e.Stderr,
		skipBad: *skipBad, chunk: *chunk, totalBytes: total, started: time.Now(), resumeDone: done,
	}
	if *resume {
		// Each chunk's lines reach the disk before the next is written, so
		// a crash loses at most the chunks in flight.
		sj.sync = func() error {
			if err := bw.Flush(); err != nil {
				return err
			}
			return outFile.f.Sync()
		}
	}
	showProgress := *progress == "on" || (*progress == "auto" && isTerminal(e.Stderr))
	var stopProgress func()
	if showProgress {
		stopProgress = sj.startProgress()
	}
	err = sj.run(ctx)
	if stopProgress != nil {
		stopProgress()
	}
	if err != nil && ctx.Err() != nil {
		err = fmt.Errorf("score: %w", service.ErrInterrupted)
	}
	// On stdout the lines scored so far still go out; a file is all or nothing.
	if ferr := bw.Flush(); err == nil && ferr != nil {
		err = fmt.Errorf("score: write: %w", ferr)
	}
	if outFile != nil && err == nil {
		if cerr := outFile.commit(); cerr != nil {
			err = fmt.Errorf("score: %s: %w", *out, cerr)
		}
	}
	if *resume && err != nil {
		if serr := outFile.f.Sync(); serr == nil {
			log.Warn().Str("partial", outFile.f.Name()).Int64("transcripts", int64(len(done))+sj.done.Load()).
				Msg("kept the completed transcripts; run again with --resume to finish")
		}
	}
	log.Info().Int64("transcripts", sj.done.Load()).Int64("skipped", sj.skipped.Load()).Int64("pairs", sj.pairs.Load()).
		Int64("bad_lines", sj.bad.Load()).Dur("elapsed", time.Since(sj.started)).Msg("score finished")
	return err
}

// scoreJob is one `scorer score` run: a reader that decodes lines into
// chunks, up to two chunks scoring at once, and a writer that keeps order.
type scoreJob struct {
	stack      *service.ScoringStack
	in         *bufio.Reader
	out        io.Writer
	stderr     io.Writer
	skipBad    bool
	chunk      int
	totalBytes int64

	// resumeDone are the call_ids of the partial output, in order: the
	// first valid input transcripts, which must match them, are skipped.
	resumeDone []string
	// sync, when set, makes each written chunk durable (--resume).
	sync func() error

	started   time.Time
	readBytes atomic.Int64
	done      atomic.Int64
	skipped   atomic.Int64
	pairs     atomic.Int64
	bad       atomic.Int64
	stderrMu  sync.Mutex
}

type scoreChunk struct {
	events []schema.TranscriptEvent
	result chan scoreResult
}

type scoreResult struct {
	scored []schema.ScoredTranscript
	err    error
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
	enc := json.NewEncoder(j.out)
	enc.SetEscapeHTML(false)
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
		for i := range res.scored {
			if err := enc.Encode(&res.scored[i]); err != nil {
				return fmt.Errorf("score: write: %w", err)
			}
		}
		if j.sync != nil {
			if err := j.sync(); err != nil {
				return fmt.Errorf("score: write: %w", err)
			}
		}
		j.done.Add(int64(len(res.scored)))
	}
}

// read decodes lines into chunks and starts scoring each chunk as soon as it
// is full, so tokenizing and inference overlap with reading.
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
	for lineNo := 1; ; lineNo++ {
		if err := ctx.Err(); err != nil {
			return err
		}
		line, err := j.in.ReadBytes('\n')
		j.readBytes.Add(int64(len(line)))
		if trimmed := bytes.TrimSpace(line); len(trimmed) > 0 {
			ev, derr := schema.DecodeEvent(trimmed, j.stack.Limits)
			switch {
			case derr == nil && valid < len(j.resumeDone):
				// Already in the partial output. The partial file is a
				// prefix of the output in input order, so position and
				// call_id must both match, or the input changed.
				if want := j.resumeDone[valid]; ev.CallID != want {
					return fmt.Errorf("score: --resume: line %d is call_id %q, but the partial output's transcript %d is %q: the input changed since the interrupted run (remove the .partial file to start over)",
						lineNo, ev.CallID, valid+1, want)
				}
				valid++
				j.skipped.Add(1)
			case derr == nil:
				valid++
				events = append(events, ev)
			case j.skipBad:
				j.bad.Add(1)
				j.reportBad(lineNo, derr)
			default:
				// The valid lines before this one still get scored and
				// written (stdout keeps exactly them; a file is dropped).
				if serr := send(); serr != nil {
					return serr
				}
				return fmt.Errorf("score: line %d: %w", lineNo, derr)
			}
			if len(events) >= j.chunk {
				if serr := send(); serr != nil {
					return serr
				}
			}
		}
		if errors.Is(err, io.EOF) {
			if valid < len(j.resumeDone) {
				return fmt.Errorf("score: --resume: the input has %d transcripts but the partial output already holds %d: the input changed since the interrupted run (remove the .partial file to start over)",
					valid, len(j.resumeDone))
			}
			return send()
		}
		if err != nil {
			return fmt.Errorf("score: read line %d: %w", lineNo, err)
		}
	}
}

// outputFile is --out written all or nothing: a temporary file in the same
// folder, renamed over --out by commit; abort (deferred) removes it, so a
// failed or interrupted run leaves an existing --out as it was. A --out that
// is not a regular file (/dev/null, a FIFO) is written in place.
type outputFile struct {
	f      *os.File
	target string // "" when writing in place
	done   bool
	keep   bool // --resume's partial file: abort keeps it
}

func createOutput(path string) (*outputFile, error) {
	mode := os.FileMode(0o644)
	target := path
	if st, err := os.Stat(path); err == nil {
		if !st.Mode().IsRegular() {
			f, err := os.OpenFile(path, os.O_WRONLY|os.O_TRUNC, 0)
			if err != nil {
				return nil, err
			}
			return &outputFile{f: f}, nil
		}
		mode = st.Mode().Perm()
		// Replace the file a symlink points to, not the symlink.
		if t, err := filepath.EvalSymlinks(path); err == nil {
			target = t
		}
	}
	f, err := os.CreateTemp(filepath.Dir(target), "."+filepath.Base(target)+".tmp-*")
	if err != nil {
		return nil, err
	}
	if err := f.Chmod(mode); err != nil {
		f.Close()
		os.Remove(f.Name())
		return nil, err
	}
	return &outputFile{f: f, target: target}, nil
}

// partialSuffix names the file --resume keeps completed transcripts in.
const partialSuffix = ".partial"

// openPartial opens <path>.partial for --resume: created if absent, else
// read back. Its complete lines are transcripts done by an earlier run;
// their call_ids are returned in order. A last line without its newline
// is a write cut short by a crash: it is cut off, to be scored again.
func openPartial(path string) (*outputFile, []string, error) {
	target := path
	mode := os.FileMode(0o644)
	if st, err := os.Stat(path); err == nil {
		if !st.Mode().IsRegular() {
			return nil, nil, fmt.Errorf("--resume needs a regular file --out, %s is not", path)
		}
		mode = st.Mode().Perm()
		if t, err := filepath.EvalSymlinks(path); err == nil {
			target = t
		}
	}
	name := target + partialSuffix
	f, err := os.OpenFile(name, os.O_RDWR|os.O_CREATE, mode)
	if err != nil {
		return nil, nil, err
	}
	ids, keep, err := readPartial(f)
	if err == nil {
		err = f.Truncate(keep)
	}
	if err == nil {
		_, err = f.Seek(keep, io.SeekStart)
	}
	if err != nil {
		f.Close()
		return nil, nil, fmt.Errorf("%s: %w", name, err)
	}
	return &outputFile{f: f, target: target, keep: true}, ids, nil
}

// readPartial returns the call_ids of f's complete lines and the length of
// those lines, where appending resumes.
func readPartial(f *os.File) (ids []string, keep int64, err error) {
	r := bufio.NewReaderSize(f, 1<<20)
	for n := 1; ; n++ {
		line, err := r.ReadBytes('\n')
		if errors.Is(err, io.EOF) {
			return ids, keep, nil // a cut-off line, or none, is dropped
		}
		if err != nil {
			return nil, 0, err
		}
		var st struct {
			CallID *string `json:"call_id"`
		}
		if err := json.Unmarshal(line, &st); err != nil || st.CallID == nil {
			return nil, 0, fmt.Errorf("line %d is not a scored transcript (%v); remove the file to start over", n, err)
		}
		ids = append(ids, *st.CallID)
		keep += int64(len(line))
	}
}

// commit makes the output visible under --out.
func (o *outputFile) commit() error {
	o.done = true
	if o.target == "" {
		return o.f.Close()
	}
	err := o.f.Sync()
	if cerr := o.f.Close(); err == nil {
		err = cerr // a failed close can lose buffered output on some filesystems
	}
	if err == nil {
		err = os.Rename(o.f.Name(), o.target)
	}
	if err != nil && !o.keep {
		os.Remove(o.f.Name())
	}
	return err
}

// abort drops the output unless commit ran.
func (o *outputFile) abort() {
	if o.done {
		return
	}
	o.done = true
	o.f.Close()
	if o.target != "" && !o.keep {
		os.Remove(o.f.Name())
	}
}

// sameFile reports whether --in and --out name one file: the same cleaned
// absolute path, or (both existing) the same file through links.
func sameFile(a, b string) bool {
	pa, errA := filepath.Abs(a)
	pb, errB := filepath.Abs(b)
	if errA == nil && errB == nil && pa == pb {
		return true
	}
	sa, errA := os.Stat(a)
	sb, errB := os.Stat(b)
	return errA == nil && errB == nil && sa.Mode().IsRegular() && os.SameFile(sa, sb)
}

// reportBad writes one JSON record per skipped line on stderr.
func (j *scoreJob) reportBad(lineNo int, err error) {
	rec := map[string]any{"line": lineNo, "error": err.Error()}
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
	if read := j.readBytes.Load(); j.totalBytes > 0 && read > 0 && !final {
		frac := float64(read) / float64(j.totalBytes)
		// Reading runs at most a few chunks ahead, so bytes read tracks progress.
		eta := time.Duration(float64(elapsed) * (1 - frac) / frac)
		line += fmt.Sprintf(", %3.0f%%, ETA %s", 100*frac, eta.Truncate(time.Second))
	}
	if skipped := j.skipped.Load(); skipped > 0 {
		line += fmt.Sprintf(", %d skipped (done before --resume)", skipped)
	}
	if bad := j.bad.Load(); bad > 0 {
		line += fmt.Sprintf(", %d bad lines", bad)
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
