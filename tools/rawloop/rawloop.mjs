// An independent raw scoring loop: the least a person would write to score
// transcripts with an NLI model, with none of scorer's code. Hugging Face
// tokenizers (0.22, through @anush008/tokenizers) encode every
// (sentence, "This text is about {label}.") pair truncated to the model's
// maximum length; the pairs are sorted by length and cut into batches of
// --batch; onnxruntime-node runs each batch on one session with its default
// options (arena, memory patterns, every core) and P(entailment) is taken
// by softmax. `make bench` runs it beside `scorer score` on the same input
// and compares the two whole processes (docs/benchmarks.md).
//
// Usage: node rawloop.mjs --model DIR --in FILE.jsonl [--model-file F] [--batch 16]
//          [--labels a,b,c] [--template 'This text is about {}.'] [--threads N]
// Prints one JSON line: pairs, load/score seconds, pairs/s and peak RSS.
import fs from 'node:fs';
import path from 'node:path';
import { parseArgs } from 'node:util';
import tk from '@anush008/tokenizers';
import ort from 'onnxruntime-node';

const { values: a } = parseArgs({
  options: {
    model: { type: 'string' },
    'model-file': { type: 'string', default: 'model.onnx' },
    in: { type: 'string' },
    batch: { type: 'string', default: '16' },
    labels: { type: 'string', default: "consumer strength,consumer weakness,reduced consumer's spending patterns" },
    template: { type: 'string', default: 'This text is about {}.' },
    threads: { type: 'string', default: '0' },
  },
});
if (!a.model || !a.in) {
  console.error('usage: node rawloop.mjs --model DIR --in FILE.jsonl [--model-file F] [--batch 16] [--threads N]');
  process.exit(2);
}
const t0 = process.hrtime.bigint();
const secs = (from) => Number(process.hrtime.bigint() - from) / 1e9;

const cfg = JSON.parse(fs.readFileSync(path.join(a.model, 'config.json'), 'utf8'));
const tcfgPath = path.join(a.model, 'tokenizer_config.json');
const tcfg = fs.existsSync(tcfgPath) ? JSON.parse(fs.readFileSync(tcfgPath, 'utf8')) : {};
const maxLength = Math.min(Number(tcfg.model_max_length) || 512, cfg.max_position_embeddings || 512, 512);
const entail = Number(Object.entries(cfg.id2label).find(([, l]) => l.toLowerCase().startsWith('entail'))[0]);
const tok = tk.Tokenizer.fromFile(path.join(a.model, 'tokenizer.json'));
tok.disablePadding();
tok.setTruncation(maxLength, { strategy: 'OnlyFirst' });
const hyps = a.labels.split(',').map((l) => a.template.replace('{}', l.trim()));

const session = await ort.InferenceSession.create(path.join(a.model, a['model-file']),
  Number(a.threads) > 0 ? { intraOpNumThreads: Number(a.threads) } : {});
const loadSeconds = secs(t0);

const t1 = process.hrtime.bigint();
const pairs = [];
for (const line of fs.readFileSync(a.in, 'utf8').split('\n')) {
  if (!line.trim()) continue;
  const ev = JSON.parse(line);
  for (const sents of Object.values(ev.sections || {})) {
    for (const s of sents) {
      for (const h of hyps) {
        const e = await tok.encode(s, h);
        pairs.push({ ids: e.getIds(), types: e.getTypeIds() });
      }
    }
  }
}
pairs.sort((x, y) => x.ids.length - y.ids.length);
const batch = Number(a.batch);
let tokens = 0;
let padded = 0;
let sum = 0;
for (let lo = 0; lo < pairs.length; lo += batch) {
  const b = pairs.slice(lo, lo + batch);
  const len = b[b.length - 1].ids.length;
  const ids = new BigInt64Array(b.length * len);
  const mask = new BigInt64Array(b.length * len);
  const types = new BigInt64Array(b.length * len);
  b.forEach((p, r) => {
    tokens += p.ids.length;
    for (let j = 0; j < p.ids.length; j++) {
      ids[r * len + j] = BigInt(p.ids[j]);
      mask[r * len + j] = 1n;
      types[r * len + j] = BigInt(p.types[j]);
    }
  });
  padded += b.length * len;
  const all = { input_ids: ids, attention_mask: mask, token_type_ids: types };
  const feeds = {};
  for (const name of session.inputNames) feeds[name] = new ort.Tensor('int64', all[name], [b.length, len]);
  const out = (await session.run(feeds))[session.outputNames[0]];
  const k = out.dims[1];
  for (let r = 0; r < b.length; r++) {
    const row = out.data.slice(r * k, (r + 1) * k);
    const m = Math.max(...row);
    const ex = Array.from(row, (v) => Math.exp(v - m));
    sum += ex[entail] / ex.reduce((x, y) => x + y, 0);
  }
}
const scoreSeconds = secs(t1);
const wall = secs(t0);
console.log(JSON.stringify({
  model: path.basename(path.resolve(a.model)), model_file: a['model-file'], pairs: pairs.length, batch,
  real_tokens: tokens, padded_tokens: padded, max_length: pairs.length ? pairs[pairs.length - 1].ids.length : 0,
  load_seconds: loadSeconds, score_seconds: scoreSeconds, wall_seconds: wall,
  pairs_per_sec: pairs.length / wall, score_pairs_per_sec: pairs.length / scoreSeconds,
  peak_rss_bytes: process.resourceUsage().maxRSS * 1024, mean_score: pairs.length ? sum / pairs.length : 0,
}));
