// Encodes real transcript sentences with the three default label hypotheses,
// in both PAIR_ENCODINGs, with Hugging Face's own tokenizers library (npm
// tokenizers@0.23.2) on the tiny models' tokenizer.json, and writes the ids as
// JSON on stdout for make_models.py, which runs the torch modules on them.
// The ids are HF's, not the Go tokenizer's, so the references stay
// independent of the code they check.
//
// Usage: HF_TOKENIZERS=/tmp/x/node_modules/tokenizers node encode_pairs.mjs TOKENIZER_JSON CORPUS
// (npm install --ignore-scripts tokenizers@0.23.2 in a scratch folder first)
import fs from 'node:fs';
import { createRequire } from 'node:module';

const [tokPath, corpus] = process.argv.slice(2);
if (!tokPath || !corpus || !process.env.HF_TOKENIZERS) {
  console.error('usage: HF_TOKENIZERS=DIR node encode_pairs.mjs TOKENIZER_JSON CORPUS');
  process.exit(2);
}
const require = createRequire(import.meta.url);
const tk = require(process.env.HF_TOKENIZERS);
const version = JSON.parse(fs.readFileSync(`${process.env.HF_TOKENIZERS}/package.json`, 'utf8')).version;

// The scorer's defaults (docs/configuration.md: LABELS, HYPOTHESIS_TEMPLATE,
// PAIR_SEPARATOR).
const LABELS = ['consumer strength', 'consumer weakness', "reduced consumer's spending patterns"];
const TEMPLATE = 'This text is about {}.';
const SEPARATOR = '</s></s>';
const SENTENCES = 50;
const STRIDE = 2003; // every 2003rd sentence of the corpus: spread over many calls
const MAX_CHARS = 600; // no pair reaches the max length, so no truncation rule is in play

const sentences = [];
let n = 0;
for (const line of fs.readFileSync(corpus, 'utf8').split('\n')) {
  if (!line || sentences.length === SENTENCES) continue;
  const ev = JSON.parse(line);
  for (const name of Object.keys(ev.sections).sort()) {
    for (const s of ev.sections[name]) {
      if (n++ % STRIDE === 0 && s.length <= MAX_CHARS && sentences.length < SENTENCES) sentences.push(s);
    }
  }
}
// Text that exercises the byte-level path: accents, non-Latin script, emoji,
// a literal special token and runs of spaces.
sentences.push('Caf\u00e9 sales in S\u00e3o Paulo rose 7% \u2014 \u6211\u4eec\u7684\u6536\u5165 \ud83d\ude80 up  twice   over.');
sentences.push('They wrote </s> and <mask> in the text, didn\'t they?');

const tok = tk.Tokenizer.fromFile(tokPath);
const hypotheses = LABELS.map((l) => TEMPLATE.replace('{}', l));
const pair = [];
const joined = [];
for (const s of sentences) {
  const p = [];
  const j = [];
  for (const h of hypotheses) {
    p.push((await tok.encode(s, h, { addSpecialTokens: true })).getIds());
    j.push((await tok.encode(s + SEPARATOR + h, null, { addSpecialTokens: true })).getIds());
  }
  pair.push(p);
  joined.push(j);
}
process.stdout.write(
  JSON.stringify({ tokenizers: `tokenizers@${version}`, labels: LABELS, hypothesis_template: TEMPLATE, pair_separator: SEPARATOR, sentences, hypotheses, pair, joined }) + '\n',
);
