package offline

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/scorer/scorer/consumer"
	"github.com/scorer/scorer/internal/scoring"
	"github.com/scorer/scorer/schema"
)

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
	// key, for Parquet rows, is what they are keyed on; records without
	// it are bad. replaced are the input positions of versions a newer
	// one of their key replaces (superseded): they are not scored.
	key      versionKey
	replaced map[int]struct{}

	started  time.Time
	done     atomic.Int64
	skipped  atomic.Int64
	older    atomic.Int64 // versions not scored: a newer one replaces them
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
	for pos := 0; ; pos++ {
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
		if _, ok := j.replaced[pos]; ok {
			j.older.Add(1)
			continue
		}
		var event schema.TranscriptEvent
		derr := rec.err
		if derr == nil {
			event, derr = schema.DecodeEvent(rec.data, j.stack.Limits)
		}
		if derr == nil && j.key != nil {
			_, derr = j.key(&event)
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
	switch {
	case errors.As(err, &de):
		rec["reason"] = de.Reason.String()
	case errors.Is(err, schema.ErrNoEventKey):
		rec["reason"] = consumer.ReasonOutputRejected // the stream's DLQ reason for it
	}
	b, _ := json.Marshal(rec)
	j.stderrMu.Lock()
	defer j.stderrMu.Unlock()
	fmt.Fprintf(j.stderr, "%s\n", b)
}
