package tokenizer

import "unicode/utf8"

// joinedGallopStart is where EncodeJoined's search for the longest premise
// prefix starts, in characters. The reference generator
// (tools/golden/generate.mjs) runs the same search with the same constant:
// a different probe sequence could settle on a different prefix wherever
// the token count is not monotonic in the prefix length.
const joinedGallopStart = 64

// EncodeJoined encodes premise+sep+hypothesis as ONE sequence through the
// post-processor's single-sequence template ([CLS] text [SEP]), exactly as
// HF's encode(premise+sep+hypothesis) does: the whole string is matched
// for added tokens, normalized and pre-tokenized at once. This is how the
// Spark job this service replaces fed its pipeline
// (f"{premise}</s></s>{hypothesis}").
//
// The ids are not, in general, the premise's and the hypothesis's own ids
// joined, so nothing is reused between pairs. With a Metaspace
// pre-tokenizer (SentencePiece models such as DeBERTa-v3) the text has no
// space at the seams, so the premise's last word, the separator and the
// hypothesis's first word form one word that the model segments as a
// whole, and the hypothesis loses the "▁" it gets when encoded alone; a
// Strip normalizer trims the joined string's ends only; a Replace over
// runs of spaces or an added token can span a seam. A BERT pre-tokenizer
// with a separator that starts and ends with punctuation ("</s></s>") does
// split at both seams, and there the joined ids happen to equal the
// pieces' ids joined; so do a byte-level BPE's (RoBERTa, BART), whose "</s>"
// is an added token that cuts the text first. TestJoinedSeams pins these
// facts on the models here.
//
// Over maxLen (> 0) the hypothesis and the separator are kept whole and
// the premise is cut to a prefix of whole characters (Unicode code points):
// the search gallops from 64 characters, doubling while the joined
// sequence fits, then bisects between the last length that fit and the
// first that did not, and keeps the longest length it found to fit.
// HF has no such truncation for one sequence (it would cut the hypothesis
// off the end); the reference generator replays this search with HF's
// tokenizer. If even an empty premise does not fit, the sequence
// separator+hypothesis is cut at the end to maxLen, so the model never sees
// more than maxLen tokens; scorers refuse such hypotheses up front.
// maxLen <= 0 means no limit.
func (t *Tokenizer) EncodeJoined(premise, sep, hypothesis string, maxLen int) (Pair, error) {
	ids, err := t.Encode(premise + sep + hypothesis)
	if err != nil {
		return Pair{}, err
	}
	if maxLen <= 0 || len(ids)+t.singleOver <= maxLen {
		return t.applySingle(ids), nil
	}
	budget := max(maxLen-t.singleOver, 0)
	// fits encodes the premise cut to its first k characters.
	fits := func(k int) ([]int32, bool, error) {
		ids, err := t.Encode(runePrefix(premise, k) + sep + hypothesis)
		return ids, err == nil && len(ids) <= budget, err
	}
	n := utf8.RuneCountInString(premise) // the whole premise does not fit
	lo, hi := 0, min(joinedGallopStart, n)
	var best []int32 // ids of the premise cut to lo characters, once known
	for hi < n {
		got, ok, err := fits(hi)
		if err != nil {
			return Pair{}, err
		}
		if !ok {
			break
		}
		lo, best = hi, got
		hi = min(2*hi, n)
	}
	for hi-lo > 1 {
		mid := lo + (hi-lo)/2
		got, ok, err := fits(mid)
		if err != nil {
			return Pair{}, err
		}
		if ok {
			lo, best = mid, got
		} else {
			hi = mid
		}
	}
	if best == nil {
		got, ok, err := fits(0)
		if err != nil {
			return Pair{}, err
		}
		if !ok {
			got = got[:budget]
		}
		best = got
	}
	return t.applySingle(best), nil
}

// runePrefix is s cut after its first k characters.
func runePrefix(s string, k int) string {
	for i := range s {
		if k == 0 {
			return s[:i]
		}
		k--
	}
	return s
}

// applySingle wraps ids in the single-sequence template.
func (t *Tokenizer) applySingle(ids []int32) Pair { return t.single.apply(ids, nil) }

// NumSpecialTokensSingle is how many tokens the single-sequence template
// adds (2 for [CLS] … [SEP]).
func (t *Tokenizer) NumSpecialTokensSingle() int { return t.singleOver }
