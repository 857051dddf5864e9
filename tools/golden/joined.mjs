// The reference for tokenizer.EncodeJoined, shared by generate.mjs and
// corpus.mjs.
export const JOINED_GALLOP_START = 64; // model/tokenizer/joined.go's joinedGallopStart

// encodeJoined is HF's encode of premise + sep + hypothesis with the
// single-sequence template, and over maxLength the same search for the
// longest premise prefix (in code points) that the Go code runs, each probe
// encoded by HF. whole, when given, is the encoding of the whole string
// already made (by a batch).
export async function encodeJoined(tok, premise, sep, hypothesis, maxLength, whole) {
  const enc = async (p) => tok.encode(p + sep + hypothesis, null, { addSpecialTokens: true });
  whole ??= await enc(premise);
  if (whole.getIds().length <= maxLength) return { enc: whole, kept: null };
  const cps = Array.from(premise);
  const n = cps.length;
  const fits = async (k) => {
    const e = await enc(cps.slice(0, k).join(''));
    return { e, ok: e.getIds().length <= maxLength };
  };
  let lo = 0;
  let hi = Math.min(JOINED_GALLOP_START, n);
  let best = null;
  while (hi < n) {
    const { e, ok } = await fits(hi);
    if (!ok) break;
    lo = hi; best = e;
    hi = Math.min(2 * hi, n);
  }
  while (hi - lo > 1) {
    const mid = lo + Math.floor((hi - lo) / 2);
    const { e, ok } = await fits(mid);
    if (ok) { lo = mid; best = e; } else hi = mid;
  }
  if (best === null) throw new Error(`joined: even an empty premise is over ${maxLength} tokens with ${JSON.stringify(hypothesis)}`);
  return { enc: best, kept: lo };
}
