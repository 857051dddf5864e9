package fanout

import (
	"context"
	"fmt"
	"runtime"
	"runtime/debug"
	"strings"
	"sync"

	"github.com/scorer/scorer/internal/fanout/scorecache"
	"github.com/scorer/scorer/model"
	"github.com/scorer/scorer/schema"
)

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
