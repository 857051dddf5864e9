package fanout

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/scorer/scorer/internal/fanout/scorecache"
	"github.com/scorer/scorer/model"
	"github.com/scorer/scorer/schema"
)

// PairScorer turns encoded pairs into P(entailment), in input order: the
// engine under the fan-out. model.Session implements it for one device and
// gpupool.Pool across devices, so TranscriptScorer need not know which it
// drives.
type PairScorer interface {
	ScorePairs(ctx context.Context, pairs []model.Pair) ([]float32, error)
}

// ScorerOption configures a TranscriptScorer.
type ScorerOption func(*scorerConfig)

type scorerConfig struct {
	now    func() time.Time
	encode func(*model.Model) func(string) ([]int32, error)
	cache  *scorecache.Cache
}

// WithCache consults c before inference: pairs already scored by this model
// (same version, score mode, class indices, hypothesis and premise tokens
// after truncation) are answered from it, and only the rest reach the
// engine. A nil c leaves the cache off. One cache may serve several scorers,
// even of different models: the key covers the model.
func WithCache(c *scorecache.Cache) ScorerOption {
	return func(cfg *scorerConfig) { cfg.cache = c }
}

// WithClock sets the clock behind ScoredAt, so tests get fixed output.
func WithClock(now func() time.Time) ScorerOption {
	return func(c *scorerConfig) { c.now = now }
}

// withEncoder replaces the tokenizer's Encode; tests use it to count calls.
func withEncoder(wrap func(*model.Model) func(string) ([]int32, error)) ScorerOption {
	return func(c *scorerConfig) { c.encode = wrap }
}

// TranscriptScorer scores whole transcript events: every sentence against
// every label's hypothesis. It is safe for concurrent use; its state is
// read-only after NewTranscriptScorer.
type TranscriptScorer struct {
	m       *model.Model
	lc      LabelConfig
	engine  PairScorer
	hyps    [][]int32 // tokenized hypotheses, by label
	hypText []string  // hypotheses, by label (joined encoding encodes them with each sentence)
	now     func() time.Time
	encode  func(string) ([]int32, error)
	cache   *scorecache.Cache
	// encoded counts sentences tokenized, for Encoded.
	encoded atomic.Uint64
	// keyBase is, per label, the SHA-256 of everything in a cache key
	// but the pair's tokens, so each pair hashes only its own tokens.
	keyBase [][sha256.Size]byte
}

// NewTranscriptScorer validates lc and tokenizes each hypothesis once, so
// Score tokenizes only sentences.
func NewTranscriptScorer(m *model.Model, lc LabelConfig, engine PairScorer, opts ...ScorerOption) (*TranscriptScorer, error) {
	if m == nil || m.Tokenizer == nil {
		return nil, errors.New("fanout: transcript scorer needs a loaded model")
	}
	if engine == nil {
		return nil, errors.New("fanout: transcript scorer needs a pair scorer")
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
		cache:  cfg.cache,
	}
	if cfg.encode != nil {
		ts.encode = cfg.encode(m)
	}
	// A premise needs at least one token beside the hypothesis and the
	// template's special tokens, or every pair would be hypothesis only.
	for _, h := range lc.Hypotheses() {
		ids, err := ts.encode(h)
		if err != nil {
			return nil, fmt.Errorf("fanout: tokenizing hypothesis %q: %w", h, err)
		}
		if err := hypothesisRoom(m, h, ids); err != nil {
			return nil, err
		}
		ts.hyps = append(ts.hyps, ids)
		ts.hypText = append(ts.hypText, h)
		ts.keyBase = append(ts.keyBase, cacheKeyBase(m, h))
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
	pairs, keys, err := ts.encodeAll(ctx, events, total)
	if err != nil {
		return nil, err
	}
	scores, err := ts.scorePairs(ctx, pairs, keys)
	if err != nil {
		return nil, fmt.Errorf("fanout: scoring %d events (%d pairs): %w", len(events), len(pairs), err)
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
			PairEncoding:       string(ts.m.PairEncoding),
			PairSeparator:      ts.m.PairSeparator,
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

// Encoded is the number of sentences tokenized so far, by every Score call.
// Tokenizing a batch of long transcripts comes before its first inference
// batch and can take seconds, so liveness counts this as progress too. It
// grows in steps of up to 64 sentences per tokenizing goroutine.
func (ts *TranscriptScorer) Encoded() uint64 { return ts.encoded.Load() }

// infer runs the engine and checks it answered every pair.
func (ts *TranscriptScorer) infer(ctx context.Context, pairs []model.Pair) ([]float32, error) {
	scores, err := ts.engine.ScorePairs(ctx, pairs)
	if err != nil {
		return nil, err
	}
	if len(scores) != len(pairs) {
		return nil, fmt.Errorf("fanout: engine returned %d scores for %d pairs", len(scores), len(pairs))
	}
	return scores, nil
}
