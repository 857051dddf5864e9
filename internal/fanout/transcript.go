package fanout

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
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
		return fmt.Errorf("fanout: hypothesis template %q must contain exactly one {}, has %d", c.Template, n)
	}
	if len(c.Labels) == 0 {
		return errors.New("fanout: no labels")
	}
	seen := make(map[string]bool, len(c.Labels))
	for i, l := range c.Labels {
		if strings.TrimSpace(l) == "" {
			return fmt.Errorf("fanout: label %d is empty", i)
		}
		if seen[l] {
			return fmt.Errorf("fanout: label %q appears twice", l)
		}
		seen[l] = true
	}
	if math.IsNaN(c.Threshold) || c.Threshold < 0 || c.Threshold > 1 {
		return fmt.Errorf("fanout: threshold %v is outside [0, 1]", c.Threshold)
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

// hypothesisRoom checks that hypothesis leaves a premise at least one
// token within m's MaxLength under its encoding. ids are the hypothesis's
// own ids (pair encoding); joined encoding measures the separator and
// hypothesis encoded together.
func hypothesisRoom(m *model.Model, hypothesis string, ids []int32) error {
	n, special := len(ids), m.Tokenizer.NumSpecialTokensPair()
	if m.PairEncoding == model.EncodeJoined {
		tail, err := m.Tokenizer.Encode(m.PairSeparator + hypothesis)
		if err != nil {
			return err
		}
		n, special = len(tail), m.Tokenizer.NumSpecialTokensSingle()
	}
	if n > m.MaxLength-special-1 {
		what := "hypothesis"
		if m.PairEncoding == model.EncodeJoined {
			what = "separator and hypothesis"
		}
		return fmt.Errorf("fanout: %s %q is %d tokens, leaving no room for a sentence within max length %d", what, hypothesis, n, m.MaxLength)
	}
	return nil
}

// cacheKeyBase hashes the part of a pair's cache key shared by every
// sentence of one label: the model's version (its ONNX SHA-256), how logits
// become a score (mode and both class indices), how the pair was encoded
// (pair or joined, and the separator) and the hypothesis text.
// Each field is length-prefixed so no two different keys hash the same
// bytes.
func cacheKeyBase(m *model.Model, hypothesis string) [sha256.Size]byte {
	h := sha256.New()
	field := func(s string) {
		var n [8]byte
		binary.LittleEndian.PutUint64(n[:], uint64(len(s)))
		h.Write(n[:])
		h.Write([]byte(s))
	}
	field("scorer score cache v1")
	field(m.SHA256)
	field(string(m.ScoreMode))
	field(strconv.Itoa(m.EntailmentIndex))
	field(strconv.Itoa(m.ContradictionIndex))
	field(string(m.PairEncoding))
	field(m.PairSeparator)
	field(hypothesis)
	var out [sha256.Size]byte
	h.Sum(out[:0])
	return out
}

// keyHasher builds cache keys; one per goroutine, reusing its buffer.
type keyHasher struct{ buf []byte }

// key is the 128-bit cache key of pair p under label base: SHA-256 over the
// base and the pair's token ids and token type ids exactly as the graph
// gets them (so after truncation), cut to its first 128 bits.
func (kh *keyHasher) key(base *[sha256.Size]byte, p model.Pair) scorecache.Key {
	b := append(kh.buf[:0], base[:]...)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(p.IDs)))
	for _, id := range p.IDs {
		b = binary.LittleEndian.AppendUint32(b, uint32(id))
	}
	for _, id := range p.TypeIDs {
		b = binary.LittleEndian.AppendUint32(b, uint32(id))
	}
	kh.buf = b
	sum := sha256.Sum256(b)
	return scorecache.Key{Hi: binary.LittleEndian.Uint64(sum[:8]), Lo: binary.LittleEndian.Uint64(sum[8:16])}
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

// scorePairs scores pairs through the cache when there is one: hits are
// filled in, each distinct missing key goes to the engine once (boilerplate
// such as "Thank you." repeats within a batch too), and the engine's scores
// are stored for next time. keys is nil when the cache is off.
func (ts *TranscriptScorer) scorePairs(ctx context.Context, pairs []model.Pair, keys []scorecache.Key) ([]float32, error) {
	if len(pairs) == 0 {
		return nil, nil
	}
	if keys == nil {
		return ts.infer(ctx, pairs)
	}
	scores := make([]float32, len(pairs))
	var missPairs []model.Pair
	var missKeys []scorecache.Key
	first := map[scorecache.Key]int{} // key → index in missPairs
	dup := map[int]int{}              // pair index → index in missPairs
	for i, k := range keys {
		if s, ok := ts.cache.Get(k); ok {
			scores[i] = s
			continue
		}
		j, seen := first[k]
		if !seen {
			j = len(missPairs)
			first[k] = j
			missPairs = append(missPairs, pairs[i])
			missKeys = append(missKeys, k)
		}
		dup[i] = j
	}
	if len(missPairs) == 0 {
		return scores, nil
	}
	got, err := ts.infer(ctx, missPairs)
	if err != nil {
		return nil, err
	}
	for j, k := range missKeys {
		ts.cache.Put(k, got[j])
	}
	for i, j := range dup {
		scores[i] = got[j]
	}
	return scores, nil
}

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
//
// With the cache on it also returns each pair's cache key, hashed in the
// same goroutines; without, keys is nil.
func (ts *TranscriptScorer) encodeAll(ctx context.Context, events []schema.TranscriptEvent, total int) (pairs []model.Pair, keys []scorecache.Key, err error) {
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
	pairs = make([]model.Pair, len(refs)*L)
	if ts.cache != nil {
		keys = make([]scorecache.Key, len(pairs))
	}
	const minChunk = 256
	workers := min(runtime.GOMAXPROCS(0), (len(refs)+minChunk-1)/minChunk)
	if workers < 1 {
		return pairs, keys, nil
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
			var kh keyHasher
			// A panic here would kill the process beyond any caller's
			// recover; report it as this sentence's error instead.
			defer func() {
				if p := recover(); p != nil {
					r := &refs[k]
					errs[w] = fmt.Errorf("%w: tokenizer panicked on call_id %q section %q sentence %d: %v (at %s)",
						model.ErrInvalidInput, r.ev.CallID, r.sec, r.idx, p, panicSite(debug.Stack()))
				}
			}()
			for ; k < hi; k++ {
				r := &refs[k]
				if err := ctx.Err(); err != nil {
					errs[w] = fmt.Errorf("fanout: tokenizing call_id %q: %w", r.ev.CallID, err)
					return
				}
				if err := ts.encodeSentence(r.text, pairs[k*L:(k+1)*L]); err != nil {
					errs[w] = fmt.Errorf("fanout: tokenizing call_id %q section %q sentence %d: %w", r.ev.CallID, r.sec, r.idx, err)
					return
				}
				if (k-lo)%64 == 63 || k == hi-1 {
					ts.encoded.Add(uint64((k-lo)%64 + 1))
				}
				if keys != nil {
					for l := range L {
						keys[k*L+l] = kh.key(&ts.keyBase[l], pairs[k*L+l])
					}
				}
			}
		}()
	}
	wg.Wait()
	// The first failing chunk holds the earliest failing sentence.
	for _, err := range errs {
		if err != nil {
			return nil, nil, err
		}
	}
	return pairs, keys, nil
}

// encodeSentence fills out (one Pair per label) for one sentence. Pair
// encoding tokenizes the sentence once and joins its ids with each label's
// hypothesis ids, which is exact: the pair template keeps the two
// sequences apart. Joined encoding tokenizes each premise+separator+
// hypothesis string whole, because the ids at the seams depend on both
// sides (tokenizer.EncodeJoined); that is L tokenizer calls per sentence
// instead of one.
func (ts *TranscriptScorer) encodeSentence(text string, out []model.Pair) error {
	if ts.m.PairEncoding == model.EncodeJoined {
		for l, h := range ts.hypText {
			p, err := ts.m.Tokenizer.EncodeJoined(text, ts.m.PairSeparator, h, ts.m.MaxLength)
			if err != nil {
				return err
			}
			out[l] = p
		}
		return nil
	}
	ids, err := ts.encode(text)
	if err != nil {
		return err
	}
	for l, h := range ts.hyps {
		out[l] = ts.m.Tokenizer.EncodePair(ids, h, ts.m.MaxLength)
	}
	return nil
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
