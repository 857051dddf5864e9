package model

import (
	"context"
	"errors"
	"fmt"
	"math"
	"runtime"
	"runtime/debug"
	"strings"
	"sync"
	"time"

	"github.com/scorer/scorer/schema"
)

// PairScorer turns encoded pairs into P(entailment), in input order. Session
// implements it for one device and gpupool.Pool across devices, so
// TranscriptScorer need not know which it drives.
type PairScorer interface {
	ScorePairs(ctx context.Context, pairs []Pair) ([]float32, error)
}

// LabelConfig is the zero-shot question asked of every sentence: one
// hypothesis per label, built from Template, and the score above which a
// sentence counts as a match.
type LabelConfig struct {
	// Template holds exactly one "{}", replaced by each label.
	Template string
	// Labels are the topics to test, in output order.
	Labels []string
	// Threshold flags a sentence when its score is strictly greater.
	Threshold float64
}

// DefaultLabelConfig is the production question set: consumer strength and
// weakness, as the original notebook asked it.
func DefaultLabelConfig() LabelConfig {
	return LabelConfig{
		Template:  "This text is about {}.",
		Labels:    []string{"consumer strength", "consumer weakness", "reduced consumer's spending patterns"},
		Threshold: 0.91,
	}
}

// Validate rejects a config that would produce meaningless or ambiguous
// output: no labels, duplicate labels (results are keyed by label), a
// template without exactly one slot, or a threshold outside [0, 1].
func (c LabelConfig) Validate() error {
	if n := strings.Count(c.Template, "{}"); n != 1 {
		return fmt.Errorf("model: hypothesis template %q must contain exactly one {}, has %d", c.Template, n)
	}
	if len(c.Labels) == 0 {
		return errors.New("model: no labels")
	}
	seen := make(map[string]bool, len(c.Labels))
	for i, l := range c.Labels {
		if strings.TrimSpace(l) == "" {
			return fmt.Errorf("model: label %d is empty", i)
		}
		if seen[l] {
			return fmt.Errorf("model: label %q appears twice", l)
		}
		seen[l] = true
	}
	if math.IsNaN(c.Threshold) || c.Threshold < 0 || c.Threshold > 1 {
		return fmt.Errorf("model: threshold %v is outside [0, 1]", c.Threshold)
	}
	return nil
}

// Hypotheses returns the hypothesis text for each label, in label order.
func (c LabelConfig) Hypotheses() []string {
	out := make([]string, len(c.Labels))
	for i, l := range c.Labels {
		out[i] = strings.Replace(c.Template, "{}", l, 1)
	}
	return out
}

// ScorerOption configures a TranscriptScorer.
type ScorerOption func(*scorerConfig)

type scorerConfig struct {
	now    func() time.Time
	encode func(*Model) func(string) ([]int32, error)
}

// WithClock sets the clock behind ScoredAt, so tests get fixed output.
func WithClock(now func() time.Time) ScorerOption {
	return func(c *scorerConfig) { c.now = now }
}

// withEncoder replaces the tokenizer's Encode; tests use it to count calls.
func withEncoder(wrap func(*Model) func(string) ([]int32, error)) ScorerOption {
	return func(c *scorerConfig) { c.encode = wrap }
}

// TranscriptScorer scores whole transcript events: every sentence against
// every label's hypothesis. It is safe for concurrent use; its state is
// read-only after NewTranscriptScorer.
type TranscriptScorer struct {
	m      *Model
	lc     LabelConfig
	engine PairScorer
	hyps   [][]int32 // tokenized hypotheses, by label
	now    func() time.Time
	encode func(string) ([]int32, error)
}

// NewTranscriptScorer validates lc and tokenizes each hypothesis once, so
// Score tokenizes only sentences.
func NewTranscriptScorer(m *Model, lc LabelConfig, engine PairScorer, opts ...ScorerOption) (*TranscriptScorer, error) {
	if m == nil || m.Tokenizer == nil {
		return nil, errors.New("model: transcript scorer needs a loaded model")
	}
	if engine == nil {
		return nil, errors.New("model: transcript scorer needs a pair scorer")
	}
	if err := lc.Validate(); err != nil {
		return nil, err
	}
	cfg := scorerConfig{now: time.Now}
	for _, o := range opts {
		o(&cfg)
	}
	ts := &TranscriptScorer{
		m:      m,
		lc:     LabelConfig{Template: lc.Template, Labels: append([]string(nil), lc.Labels...), Threshold: lc.Threshold},
		engine: engine,
		now:    cfg.now,
		encode: m.Tokenizer.Encode,
	}
	if cfg.encode != nil {
		ts.encode = cfg.encode(m)
	}
	// A premise needs at least one token beside the hypothesis and the
	// template's special tokens, or every pair would be hypothesis only.
	room := m.MaxLength - m.Tokenizer.NumSpecialTokensPair() - 1
	for _, h := range lc.Hypotheses() {
		ids, err := ts.encode(h)
		if err != nil {
			return nil, fmt.Errorf("model: tokenizing hypothesis %q: %w", h, err)
		}
		if len(ids) > room {
			return nil, fmt.Errorf("model: hypothesis %q is %d tokens, leaving no room for a sentence within max length %d", h, len(ids), m.MaxLength)
		}
		ts.hyps = append(ts.hyps, ids)
	}
	return ts, nil
}

// Labels returns the labels scored, in output order.
func (ts *TranscriptScorer) Labels() []string { return append([]string(nil), ts.lc.Labels...) }

// PairCount is how many pairs Score will send for ev: every sentence against
// every label. Batchers use it to size work before tokenizing.
func (ts *TranscriptScorer) PairCount(ev *schema.TranscriptEvent) int {
	return ev.SentenceCount() * len(ts.lc.Labels)
}

// Score scores events in one engine call, so the engine sees every pair of
// the batch at once and can pack them by length. Results are in event order.
func (ts *TranscriptScorer) Score(ctx context.Context, events []schema.TranscriptEvent) ([]schema.ScoredTranscript, error) {
	L := len(ts.hyps)
	total := 0
	for i := range events {
		total += ts.PairCount(&events[i])
	}
	pairs, err := ts.encodeAll(ctx, events, total)
	if err != nil {
		return nil, err
	}

	var scores []float32
	if len(pairs) > 0 {
		if scores, err = ts.engine.ScorePairs(ctx, pairs); err != nil {
			return nil, fmt.Errorf("model: scoring %d events (%d pairs): %w", len(events), len(pairs), err)
		}
		if len(scores) != len(pairs) {
			return nil, fmt.Errorf("model: engine returned %d scores for %d pairs", len(scores), len(pairs))
		}
	}

	scoredAt := ts.now().UTC().Format(time.RFC3339)
	out := make([]schema.ScoredTranscript, len(events))
	next := 0 // index of the event's first pair in scores
	for i := range events {
		ev := &events[i]
		st := schema.ScoredTranscript{
			CallID:             ev.CallID,
			EntityID:           ev.EntityID,
			CompanyName:        ev.CompanyName,
			CallName:           ev.CallName,
			EventTime:          ev.EventTime,
			VersionID:          ev.VersionID,
			Model:              ts.m.Info(),
			HypothesisTemplate: ts.lc.Template,
			ScoreMode:          string(ts.m.ScoreMode),
			Threshold:          ts.lc.Threshold,
			Labels:             append([]string(nil), ts.lc.Labels...),
			Sections:           make(map[string]schema.SectionResult, len(ev.Sections)),
			ScoredAt:           scoredAt,
		}
		for _, sec := range ev.SectionNames() {
			sents := ev.Sections[sec]
			res := make(map[string]schema.LabelResult, L)
			for l, label := range ts.lc.Labels {
				lr := schema.LabelResult{
					Scores:  make([]float32, len(sents)),
					Flags:   make([]int, len(sents)),
					Matches: []string{},
				}
				for j, sent := range sents {
					s := scores[next+j*L+l]
					lr.Scores[j] = s
					if float64(s) > ts.lc.Threshold {
						lr.Flags[j] = 1
						lr.Matches = append(lr.Matches, sent)
					}
				}
				res[label] = lr
			}
			next += len(sents) * L
			st.Sections[sec] = schema.SectionResult{Sentences: len(sents), Results: res, Text: sents}
		}
		out[i] = st
	}
	return out, nil
}

// sentenceRef locates one sentence of a batch of events.
type sentenceRef struct {
	ev   *schema.TranscriptEvent
	sec  string
	idx  int
	text string
}

// encodeAll tokenizes every sentence once and assembles its L pairs, laid
// out sentence by sentence (sentence k's pairs at k·L … k·L+L−1) in
// SectionNames order. Sentences are split over GOMAXPROCS goroutines: the
// tokenizer is read-only, and a consumer batch of 16 transcripts is some
// 7 000 sentences, which tokenized serially would keep a GPU waiting.
func (ts *TranscriptScorer) encodeAll(ctx context.Context, events []schema.TranscriptEvent, total int) ([]Pair, error) {
	L := len(ts.hyps)
	refs := make([]sentenceRef, 0, total/max(L, 1))
	for i := range events {
		ev := &events[i]
		for _, sec := range ev.SectionNames() {
			for j, sent := range ev.Sections[sec] {
				refs = append(refs, sentenceRef{ev: ev, sec: sec, idx: j, text: sent})
			}
		}
	}
	pairs := make([]Pair, len(refs)*L)
	const minChunk = 256
	workers := min(runtime.GOMAXPROCS(0), (len(refs)+minChunk-1)/minChunk)
	if workers < 1 {
		return pairs, nil
	}
	errs := make([]error, workers)
	var wg sync.WaitGroup
	chunk := (len(refs) + workers - 1) / workers
	for w := range workers {
		lo, hi := w*chunk, min((w+1)*chunk, len(refs))
		wg.Add(1)
		go func() {
			defer wg.Done()
			k := lo
			// A panic here would kill the process beyond any caller's
			// recover; report it as this sentence's error instead.
			defer func() {
				if p := recover(); p != nil {
					r := &refs[k]
					errs[w] = fmt.Errorf("%w: tokenizer panicked on call_id %q section %q sentence %d: %v (at %s)",
						ErrInvalidInput, r.ev.CallID, r.sec, r.idx, p, panicSite(debug.Stack()))
				}
			}()
			for ; k < hi; k++ {
				r := &refs[k]
				if err := ctx.Err(); err != nil {
					errs[w] = fmt.Errorf("model: tokenizing call_id %q: %w", r.ev.CallID, err)
					return
				}
				ids, err := ts.encode(r.text)
				if err != nil {
					errs[w] = fmt.Errorf("model: tokenizing call_id %q section %q sentence %d: %w", r.ev.CallID, r.sec, r.idx, err)
					return
				}
				for l, h := range ts.hyps {
					pairs[k*L+l] = ts.m.Tokenizer.EncodePair(ids, h, ts.m.MaxLength)
				}
			}
		}()
	}
	wg.Wait()
	// The first failing chunk holds the earliest failing sentence.
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	return pairs, nil
}

// panicSite is the first frame of a panic's stack below the runtime's own:
// enough to find the bug without putting a whole stack into an error.
func panicSite(stack []byte) string {
	lines := strings.Split(string(stack), "\n")
	for i := 1; i+1 < len(lines); i += 2 {
		fn := strings.TrimSpace(lines[i])
		if fn == "" || strings.HasPrefix(fn, "runtime") || strings.HasPrefix(fn, "panic(") || strings.Contains(fn, "encodeAll.func") {
			continue
		}
		return fn + " " + strings.TrimSpace(lines[i+1])
	}
	return "unknown"
}
