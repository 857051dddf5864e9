package main

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
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/term"

	"github.com/scorer/scorer/schema"
)

// runScore is the offline scorer: TranscriptEvent JSONL in, ScoredTranscript
// JSONL out, same order, through the same scoring stack as the service.
func runScore(ctx context.Context, e procEnv, args []string) error {
	fs := flag.NewFlagSet("score", flag.ContinueOnError)
	fs.SetOutput(e.stderr)
	in := fs.String("in", "-", "TranscriptEvent JSONL file; - = stdin")
	out := fs.String("out", "-", "ScoredTranscript JSONL file; - = stdout")
	modelDir := fs.String("model", "", "model folder (overrides MODEL_DIR / --model-dir)")
	skipBad := fs.Bool("skip-bad", false, "report bad lines on stderr as JSON and go on, instead of stopping")
	chunk := fs.Int("chunk", 8, "transcripts per scoring call; two calls are in flight so reading overlaps scoring")
	progress := fs.String("progress", "auto", "progress bar on stderr: auto (when a terminal), on, off")
	cfg, err := loadConfig(e.getenv, fs, args)
	if err != nil {
		return usageOr(err)
	}
	if *modelDir != "" {
		cfg.ModelDir = *modelDir
	}
	if *chunk <= 0 {
		return errors.New("score: --chunk must be > 0")
	}
	log, err := newLogger(e.stderr, cfg.LogLevel, cfg.LogFormat)
	if err != nil {
		return err
	}

	r, total, closeIn, err := openInput(*in, e.stdin) // total: input bytes, for the ETA
	if err != nil {
		return fmt.Errorf("score: %w", err)
	}
	defer closeIn()
	var w io.Writer = e.stdout
	closeOut := func() error { return nil }
	if *out != "-" {
		f, err := os.Create(*out)
		if err != nil {
			return fmt.Errorf("score: %w", err)
		}
		defer f.Close() // a no-op after closeOut; covers early returns
		w, closeOut = f, f.Close
	}

	stack, err := openScoring(ctx, cfg, log, nil)
	if err != nil {
		return err
	}
	defer stack.Close(context.Background())

	bw := bufio.NewWriterSize(w, 1<<20)
	sj := &scoreJob{
		stack: stack, in: bufio.NewReaderSize(r, 1<<20), out: bw, stderr: e.stderr,
		skipBad: *skipBad, chunk: *chunk, totalBytes: total, started: time.Now(),
	}
	showProgress := *progress == "on" || (*progress == "auto" && isTerminal(e.stderr))
	var stopProgress func()
	if showProgress {
		stopProgress = sj.startProgress()
	}
	err = sj.run(ctx)
	if stopProgress != nil {
		stopProgress()
	}
	if ferr := bw.Flush(); err == nil && ferr != nil {
		err = fmt.Errorf("score: write: %w", ferr)
	}
	// A failed close can lose buffered output on some filesystems.
	if cerr := closeOut(); err == nil && cerr != nil {
		err = fmt.Errorf("score: close %s: %w", *out, cerr)
	}
	log.Info().Int64("transcripts", sj.done.Load()).Int64("pairs", sj.pairs.Load()).
		Int64("bad_lines", sj.bad.Load()).Dur("elapsed", time.Since(sj.started)).Msg("score finished")
	return err
}

// scoreJob is one `scorer score` run: a reader that decodes lines into
// chunks, up to two chunks scoring at once, and a writer that keeps order.
type scoreJob struct {
	stack      *scoringStack
	in         *bufio.Reader
	out        io.Writer
	stderr     io.Writer
	skipBad    bool
	chunk      int
	totalBytes int64

	started   time.Time
	readBytes atomic.Int64
	done      atomic.Int64
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

func (j *scoreJob) run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// The buffer of 1 plus the chunk being written bounds memory to a few chunks.
	chunks := make(chan *scoreChunk, 1)
	readErr := make(chan error, 1)
	go func() {
		defer close(chunks)
		readErr <- j.read(ctx, chunks)
	}()
	enc := json.NewEncoder(j.out)
	enc.SetEscapeHTML(false)
	for c := range chunks {
		res := <-c.result
		if res.err != nil {
			cancel()
			for range chunks { // let the reader finish
			}
			return res.err
		}
		for i := range res.scored {
			if err := enc.Encode(&res.scored[i]); err != nil {
				cancel()
				for range chunks {
				}
				return fmt.Errorf("score: write: %w", err)
			}
		}
		j.done.Add(int64(len(res.scored)))
	}
	return <-readErr
}

// read decodes lines into chunks and starts scoring each chunk as soon as it
// is full, so tokenizing and inference overlap with reading.
func (j *scoreJob) read(ctx context.Context, chunks chan<- *scoreChunk) error {
	var events []schema.TranscriptEvent
	send := func() error {
		if len(events) == 0 {
			return nil
		}
		c := &scoreChunk{events: events, result: make(chan scoreResult, 1)}
		events = nil
		for _, ev := range c.events {
			j.pairs.Add(int64(j.stack.scorer.PairCount(&ev)))
		}
		go func() {
			scored, err := j.stack.scorer.Score(ctx, c.events)
			c.result <- scoreResult{scored: scored, err: err}
		}()
		select {
		case chunks <- c:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	for lineNo := 1; ; lineNo++ {
		line, err := j.in.ReadBytes('\n')
		j.readBytes.Add(int64(len(line)))
		if trimmed := bytes.TrimSpace(line); len(trimmed) > 0 {
			ev, derr := schema.DecodeEvent(trimmed, j.stack.limits)
			switch {
			case derr == nil:
				events = append(events, ev)
			case j.skipBad:
				j.bad.Add(1)
				j.reportBad(lineNo, derr)
			default:
				return fmt.Errorf("score: line %d: %w", lineNo, derr)
			}
			if len(events) >= j.chunk {
				if serr := send(); serr != nil {
					return serr
				}
			}
		}
		if errors.Is(err, io.EOF) {
			return send()
		}
		if err != nil {
			return fmt.Errorf("score: read line %d: %w", lineNo, err)
		}
	}
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
	stats := j.stack.pool.Stats()
	rate := float64(stats.Pairs) / max(elapsed.Seconds(), 1e-9)
	line := fmt.Sprintf("\r%d transcripts scored, %d pairs, %.0f pairs/s, %s", done, stats.Pairs, rate, elapsed.Truncate(time.Second))
	if read := j.readBytes.Load(); j.totalBytes > 0 && read > 0 && !final {
		frac := float64(read) / float64(j.totalBytes)
		// Reading runs at most a few chunks ahead, so bytes read tracks progress.
		eta := time.Duration(float64(elapsed) * (1 - frac) / frac)
		line += fmt.Sprintf(", %3.0f%%, ETA %s", 100*frac, eta.Truncate(time.Second))
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

// usageOr maps flag parsing errors (already printed by the flag package) to
// errUsage and passes other errors through.
func usageOr(err error) error {
	if errors.Is(err, flag.ErrHelp) {
		return errUsage
	}
	return err
}
