// Writes model/testdata/golden/<model>.json for every model folder under
// ../shared/models and the repository's testdata/models: the reference tokenizer's ids (HF tokenizers 0.22 through
// @anush008/tokenizers) and the reference ONNX Runtime's logits for real
// transcript sentences and hand-picked hard cases. It also writes
// <model>.joined.json, the same for PAIR_ENCODING=joined: premise +
// separator + hypothesis encoded as one string with the single-sequence
// template. The Go tokenizer and scorer tests compare against these files;
// see README.md.
//
// Usage: node generate.mjs   (from tools/golden, after npm install)
import fs from 'node:fs';
import path from 'node:path';
import readline from 'node:readline';
import { fileURLToPath } from 'node:url';
import tk from '@anush008/tokenizers';
import ort from 'onnxruntime-node';
import { encodeJoined } from './joined.mjs';

const here = path.dirname(fileURLToPath(import.meta.url));
const repo = path.resolve(here, '..', '..');
const shared = process.env.SHARED_DIR ? path.resolve(process.env.SHARED_DIR) : path.resolve(repo, '..', 'shared');
const modelsDir = path.join(shared, 'models');
// The repository's own model folders (tools/tiny-models: the byte-level BPE
// RoBERTa and BART), whose graph is onnx/model.onnx.
const repoModelsDir = path.join(repo, 'testdata', 'models');
const transcripts = path.join(shared, 'data', 'transcripts', 'transcripts.jsonl');
const outDir = path.join(repo, 'model', 'testdata', 'golden');

const LABELS = ['consumer strength', 'consumer weakness', "reduced consumer's spending patterns"];
const HYPOTHESES = LABELS.map((l) => `This text is about ${l}.`);
const LONG_HYPOTHESIS =
  'This text is about reduced consumer spending patterns, weaker discretionary purchases, ' +
  'trading down to cheaper private-label goods, and households cutting back because of inflation and higher interest rates.';
const REAL_SENTENCES = 300;

const HARD_CASES = [
  '',
  ' ',
  '   leading and trailing whitespace   ',
  'tabs\tand\nnewlines\r\nand   multiple   spaces',
  '\u201cCurly quotes\u201d and \u2018single ones\u2019 \u2014 with dashes \u2013 too\u2026',
  'Caf\u00e9, na\u00efve, \u00c5ngstr\u00f6m, r\u00e9sum\u00e9, Stra\u00dfe, \u0130stanbul',
  'Decomposed: Cafe\u0301 and nai\u0308ve',
  '\u6211\u4eec\u7684\u6536\u5165\u589e\u957f\u4e8612%\u3002\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8\u3068\ud55c\uad6d\uc5b4',
  'Emoji \ud83d\ude00\ud83d\ude80 and ZWJ \ud83d\udc68\u200d\ud83d\udc69\u200d\ud83d\udc67\u200d\ud83d\udc66 family, flag \ud83c\uddfa\ud83c\uddf8, skin tone \ud83d\udc4d\ud83c\udffd, new \ud83e\udd72\ud83e\udee0',
  'Revenue was $1,234.56 million, up 12% (\u20ac980M, \u00a5150B, \u00a375.5M); EPS $0.07.',
  'NUL\u0000inside and control\u0001\u0007\u001b chars\u007f here\u0085',
  'Literal \u2581 metaspace \u2581\u2581 char\u2581',
  '\u2581already metaspace\u2581',
  '[MASK] and [CLS] literal',
  'We saw [SEP] in text, and [UNK] and [PAD] too, also[MASK]glued.',
  'Full-width \uff21\uff22\uff23\uff11\uff12\uff13\uff01\uff1f \uff08note\uff09',
  'Soft\u00adhyphen, zero\u200bwidth, BOM\ufeffhere, RTL \u202eevil\u202c text',
  'Ligatures \ufb01nance \ufb02ow, superscript x\u00b2 and \u2460 \u2162 \u00bd',
  'Arabic \u0627\u0644\u0639\u0631\u0628\u064a\u0629 and Hebrew \u05e2\u05d1\u05e8\u05d9\u05ea and Thai \u0e20\u0e32\u0e29\u0e32\u0e44\u0e17\u0e22 and Hindi \u0939\u093f\u0928\u094d\u0926\u0940',
  'Greek \u03a3\u039f\u03a6\u0399\u0391 \u03c3\u03bf\u03c6\u03af\u03b1\u03c2 and Cyrillic \u041f\u0420\u0418\u0412\u0415\u0422',
  'ALL CAPS SHOUTING ABOUT Q4 EBITDA AND YOY GROWTH',
  'supercalifragilisticexpialidocious' + 'x'.repeat(120) + ' word',
  'Private use \ue000\uf8ff and replacement \ufffd and noncharacter \ufdd0',
  'e-commerce, co-op, don\'t, it\'s, we\'re, Q&A, R&D, S&P 500, 10-K, 3.5x, 1/2, 50/50',
  '....!!!???;;;:::---___///\\\\\\|||',
];

// PAIR_ENCODING=joined: the Spark job's separator, and on a subset a second
// one that holds an added token and spaces. JOINED_SEAMS are premises whose
// end meets the separator in the ways that break a piecewise encoding.
const SEPARATOR = '</s></s>';
const OTHER_SEPARATOR = ' [SEP] ';
const JOINED_SEAMS = [
  'Ends with spaces   ',
  'Ends with a tag <',
  'Ends with half a separator </s',
  'Ends with half a token [SE',
  'Ends with a metaspace \u2581',
  'Ends with an accent Cafe\u0301',
  'Already joined</s></s>',
  'Revenue'.repeat(400),
];
async function readSentences() {
  const calls = [];
  const rl = readline.createInterface({ input: fs.createReadStream(transcripts), crlfDelay: Infinity });
  for await (const line of rl) {
    if (!line.trim()) continue;
    const j = JSON.parse(line);
    calls.push({ md: j.sections?.FILT_MD ?? [], qa: j.sections?.FILT_QA ?? [] });
  }
  return calls;
}

// Deterministic spread: evenly spaced calls, alternating sections, a
// pseudo-random (fixed multiplier) sentence in each, plus the longest ones.
function pickSentences(calls) {
  const picked = [];
  const seen = new Set();
  const add = (s) => { if (typeof s === 'string' && !seen.has(s)) { seen.add(s); picked.push(s); } };
  const all = calls.flatMap((c) => [...c.md, ...c.qa]);
  const longest = [...all].sort((a, b) => b.length - a.length || (a < b ? -1 : 1)).slice(0, 8);
  longest.forEach(add);
  for (let i = 0; picked.length < REAL_SENTENCES && i < REAL_SENTENCES * 4; i++) {
    const call = calls[Math.floor((i * calls.length) / REAL_SENTENCES) % calls.length];
    const sec = i % 2 === 0 ? call.md : call.qa;
    if (sec.length === 0) continue;
    add(sec[(i * 7919 + 13) % sec.length]);
  }
  // One premise far beyond 512 tokens so truncation is exercised.
  let long = '';
  for (const s of longest) { long += (long ? ' ' : '') + s; if (long.length > 6000) break; }
  return { picked, long };
}

function softmax(xs) {
  const m = Math.max(...xs);
  const e = xs.map((x) => Math.exp(x - m));
  const sum = e.reduce((a, b) => a + b, 0);
  return e.map((x) => x / sum);
}

async function runOnnx(session, cases, eos) {
  // Batches of equal length need no padding, so every logit is exactly
  // what an unpadded single run gives. A model whose config names an
  // eos_token_id also groups by its count: BART's head reads each row's
  // last </s> through a reshape that needs the same count in every row.
  const byLen = new Map();
  cases.forEach((c, i) => {
    const k = typeof eos === 'number' ? `${c.input_ids.length}:${c.input_ids.filter((id) => id === eos).length}` : c.input_ids.length;
    if (!byLen.has(k)) byLen.set(k, []);
    byLen.get(k).push(i);
  });
  const names = session.inputNames;
  for (const idxs of byLen.values()) {
    const len = cases[idxs[0]].input_ids.length;
    for (let b = 0; b < idxs.length; b += 64) {
      const batch = idxs.slice(b, b + 64);
      const mk = (f) => new ort.Tensor('int64', BigInt64Array.from(batch.flatMap((i) => f(cases[i]).map(BigInt))), [batch.length, len]);
      const feeds = {};
      for (const n of names) {
        if (n === 'input_ids') feeds[n] = mk((c) => c.input_ids);
        else if (n === 'attention_mask') feeds[n] = mk((c) => c.input_ids.map(() => 1));
        else if (n === 'token_type_ids') feeds[n] = mk((c) => c.token_type_ids);
        else throw new Error(`unexpected graph input ${n}`);
      }
      const out = await session.run(feeds);
      const logits = out[session.outputNames[0]];
      const width = logits.dims[1];
      batch.forEach((ci, r) => {
        const row = Array.from(logits.data.slice(r * width, (r + 1) * width));
        cases[ci].logits = row;
        cases[ci].probs = softmax(row);
      });
    }
  }
}

async function crossCheck(name, dir, cases, maxLength) {
  try {
    const { AutoTokenizer, env } = await import('@huggingface/transformers');
    env.allowRemoteModels = false;
    env.localModelPath = path.dirname(dir) + path.sep;
    const t = await AutoTokenizer.from_pretrained(name, { local_files_only: true });
    let same = 0;
    const diffs = [];
    for (const c of cases) {
      const enc = t(c.premise, { text_pair: c.hypothesis, truncation: true, max_length: maxLength });
      const ids = Array.from(enc.input_ids.data, Number);
      if (JSON.stringify(ids) === JSON.stringify(c.input_ids)) same++;
      else if (diffs.length < 3) diffs.push(JSON.stringify(c.premise).slice(0, 80));
    }
    console.log(`  transformers.js agrees on ${same}/${cases.length} pairs${diffs.length ? '; e.g. differs on ' + diffs.join(', ') : ''}`);
  } catch (e) {
    console.log(`  transformers.js cross-check skipped: ${e.message}`);
  }
}

async function main() {
  const calls = await readSentences();
  const { picked, long } = pickSentences(calls);
  const premises = [...picked, ...HARD_CASES, long];
  fs.mkdirSync(outDir, { recursive: true });
  // A model folder has a graph and a config; a tokenizer-only folder (deberta-v3-tokenizer) is
  // covered by the model built on it (nli-deberta-v3-tiny uses the same tokenizer files).
  const graphOf = (dir) => ['model.onnx', path.join('onnx', 'model.onnx')].map((f) => path.join(dir, f)).find((f) => fs.existsSync(f));
  const isModel = (dir) => ['tokenizer.json', 'config.json'].every((f) => fs.existsSync(path.join(dir, f))) && graphOf(dir);
  const inRoot = (root) => (fs.existsSync(root) ? fs.readdirSync(root).sort().map((d) => path.join(root, d)).filter(isModel) : []);
  const folders = [...inRoot(modelsDir), ...inRoot(repoModelsDir)];
  for (const dir of folders) {
    const name = path.basename(dir);
    const tcfg = JSON.parse(fs.readFileSync(path.join(dir, 'tokenizer_config.json'), 'utf8'));
    const mcfg = JSON.parse(fs.readFileSync(path.join(dir, 'config.json'), 'utf8'));
    const maxLength = Math.min(Number(tcfg.model_max_length) || 512, 512);
    const plain = tk.Tokenizer.fromFile(path.join(dir, 'tokenizer.json'));
    plain.disableTruncation();
    plain.disablePadding();
    const pair = tk.Tokenizer.fromFile(path.join(dir, 'tokenizer.json'));
    pair.disablePadding();
    pair.setTruncation(maxLength, { strategy: 'OnlyFirst' });
    const cases = [];
    for (const [pi, premise] of premises.entries()) {
      const premiseIds = (await plain.encode(premise, null, { addSpecialTokens: false })).getIds();
      // Every premise against the three labels; the long hypothesis on a
      // subset keeps the file small.
      const hyps = pi % 10 === 0 || pi >= picked.length ? [...HYPOTHESES, LONG_HYPOTHESIS] : HYPOTHESES;
      for (const hypothesis of hyps) {
        const enc = await pair.encode(premise, hypothesis);
        cases.push({
          premise,
          hypothesis,
          premise_ids: premiseIds,
          input_ids: enc.getIds(),
          token_type_ids: enc.getTypeIds(),
        });
      }
    }
    const session = await ort.InferenceSession.create(graphOf(dir), { intraOpNumThreads: 2 });
    await runOnnx(session, cases, mcfg.eos_token_id);
    const golden = {
      model: name,
      generator: 'tools/golden/generate.mjs',
      tokenizer_lib: '@anush008/tokenizers 0.6.0',
      ort: 'onnxruntime-node 1.30.0',
      max_length: maxLength,
      id2label: mcfg.id2label,
      input_names: session.inputNames,
      cases,
    };
    const file = path.join(outDir, `${name}.json`);
    fs.writeFileSync(file, JSON.stringify(golden) + '\n');
    const truncated = cases.filter((c) => c.input_ids.length === maxLength).length;
    console.log(`${name}: ${cases.length} cases (${truncated} truncated to ${maxLength}), ${(fs.statSync(file).size / 1024).toFixed(0)} KiB -> ${path.relative(repo, file)}`);
    await crossCheck(name, dir, cases, maxLength);

    // PAIR_ENCODING=joined. The single-sequence tokenizer has no truncation
    // of its own: encodeJoined does the cutting.
    const single = tk.Tokenizer.fromFile(path.join(dir, 'tokenizer.json'));
    single.disableTruncation();
    single.disablePadding();
    const joined = [];
    for (const [pi, premise] of [...premises, ...JOINED_SEAMS].entries()) {
      const hyps = pi % 10 === 0 || pi >= picked.length ? [...HYPOTHESES, LONG_HYPOTHESIS] : HYPOTHESES;
      const seps = pi % 10 === 0 || pi >= picked.length ? [SEPARATOR, OTHER_SEPARATOR] : [SEPARATOR];
      for (const separator of seps) {
        for (const hypothesis of hyps) {
          const { enc, kept } = await encodeJoined(single, premise, separator, hypothesis, maxLength);
          joined.push({
            premise,
            separator,
            hypothesis,
            premise_chars_kept: kept,
            input_ids: enc.getIds(),
            token_type_ids: enc.getTypeIds(),
          });
        }
      }
    }
    await runOnnx(session, joined, mcfg.eos_token_id);
    const jfile = path.join(outDir, `${name}.joined.json`);
    fs.writeFileSync(jfile, JSON.stringify({ ...golden, pair_encoding: 'joined', cases: joined }) + '\n');
    const cut = joined.filter((c) => c.premise_chars_kept !== null).length;
    console.log(`${name} joined: ${joined.length} cases (${cut} with the premise cut), ${(fs.statSync(jfile).size / 1024).toFixed(0)} KiB -> ${path.relative(repo, jfile)}`);
  }
}

main().catch((e) => { console.error(e); process.exit(1); });
