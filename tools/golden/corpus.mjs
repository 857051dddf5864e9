// Writes model/testdata/golden/corpus-digest.json: for every tokenizer
// below and both PAIR_ENCODINGs, SHA-256 digests of the ids Hugging Face's
// tokenizers library gives for EVERY sentence of the transcript corpus with
// each of the three default label hypotheses, one digest per chunk of
// CHUNK_LINES transcripts. model/tokenizer's TestHFCorpus recomputes them
// with the Go tokenizer and names the first chunk that differs; this
// script's --dump mode prints that chunk's cases, which the Go test then
// compares one by one (see README.md).
//
// The reference is @anush008/tokenizers 0.6.0 (HF tokenizers 0.22.2, the
// golden files' reference); HF's own npm binding, tokenizers 0.23.2, encodes
// every CROSS_CHECK-th chunk again, each pair by encode(s, h) (see
// encodeChunk), and the script fails if the two differ.
//
// Usage (from tools/golden, after npm install):
//   node corpus.mjs                              write the digest file
//   node corpus.mjs --dump NAME ENCODING CHUNK   that chunk's cases as JSONL
import crypto from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import { createRequire } from 'node:module';
import { spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import anush from '@anush008/tokenizers';
import { repo, shared, resolve, tokenizerJSON } from './overlay.mjs';
import { encodeJoined } from './joined.mjs';

const hf = createRequire(import.meta.url)('tokenizers');
const LIBS = [['@anush008/tokenizers 0.6.0 (tokenizers 0.22.2)', anush], ['tokenizers 0.23.2', hf]];

// The scorer's defaults (internal/config: LABELS, HYPOTHESIS_TEMPLATE,
// PAIR_SEPARATOR) and the max length of every model here.
const LABELS = ['consumer strength', 'consumer weakness', "reduced consumer's spending patterns"];
const HYPOTHESES = LABELS.map((l) => `This text is about ${l}.`);
const SEPARATOR = '</s></s>';
const MAX_LENGTH = 512;
const CHUNK_LINES = 10;
const DIGEST_HEX = 16; // 64 bits of each SHA-256: enough to tell a change
const CROSS_CHECK = 32;
// Chunks digested: every BPE_STRIDE-th for byte-level BPE tokenizers, every
// UNIGRAM_STRIDE-th for SentencePiece Unigram ones (several times a BPE's
// cost: 128k pieces, long joined strings); chunks between get "" and are
// not checked. 1 and 1 (the defaults) is the whole corpus: about an hour
// and a half of CPU for all tokenizers. The committed digest is the whole
// corpus (made with strides 4 and 16, then 2 and 8, then 1, each step with
// CORPUS_REUSE=1), and TestHFCorpus refuses one that is not.
const BPE_STRIDE = Number(process.env.CORPUS_BPE_STRIDE) || 1;
const UNIGRAM_STRIDE = Number(process.env.CORPUS_UNIGRAM_STRIDE) || 1;

const transcripts = path.join(shared, 'data', 'transcripts', 'transcripts.jsonl');
const outFile = path.join(repo, 'model', 'testdata', 'golden', 'corpus-digest.json');

// sources are the tokenizers checked: every tokenizer.json of the
// repository's model folders (one entry per distinct file), the DeBERTa-v3
// tokenizer, and every variant under testdata/tokenizers.
function sources() {
  const out = [];
  const seen = new Map();
  const models = path.join(repo, 'testdata', 'models');
  for (const d of fs.readdirSync(models).sort()) {
    const src = `testdata/models/${d}/tokenizer.json`;
    if (!fs.existsSync(resolve(src))) continue;
    const sha = crypto.createHash('sha256').update(fs.readFileSync(resolve(src))).digest('hex');
    if (seen.has(sha)) { seen.get(sha).also.push(src); continue; }
    const e = { name: d, source: src, also: [] };
    seen.set(sha, e);
    out.push(e);
  }
  out.push({ name: 'deberta-v3-tokenizer', source: 'shared:models/deberta-v3-tokenizer/tokenizer.json', also: [] });
  const variants = path.join(repo, 'testdata', 'tokenizers');
  for (const d of fs.readdirSync(variants).sort()) {
    out.push({ name: d, source: `testdata/tokenizers/${d}/variant.json`, also: [] });
  }
  return out;
}

// chunks yields each chunk's sentences: sections by name within a
// transcript, every sentence, duplicates included.
function* chunks() {
  const lines = fs.readFileSync(transcripts, 'utf8').split('\n').filter((l) => l.trim() !== '');
  for (let i = 0; i < lines.length; i += CHUNK_LINES) {
    const sentences = [];
    for (const line of lines.slice(i, i + CHUNK_LINES)) {
      const ev = JSON.parse(line);
      for (const name of Object.keys(ev.sections).sort()) sentences.push(...ev.sections[name]);
    }
    yield sentences;
  }
}

// caseBytes is one case as the Go test hashes it: the count, the ids and
// the type ids, each a little-endian int32.
function caseBytes(ids, typeIds) {
  const b = Buffer.alloc(4 * (1 + 2 * ids.length));
  b.writeInt32LE(ids.length, 0);
  ids.forEach((v, i) => b.writeInt32LE(v, 4 * (1 + i)));
  typeIds.forEach((v, i) => b.writeInt32LE(v, 4 * (1 + ids.length + i)));
  return b;
}

const hex = (h) => h.digest('hex').slice(0, DIGEST_HEX);

// encodeChunk returns the chunk's cases in order (sentence, then
// hypothesis) for one encoding: [ids, typeIds, premise chars kept]. The
// bindings' encodeBatch takes single strings only, so a pair is, unless
// full is set, HF's post-processor (postProcess) run on HF's batch
// encodings of the sentence and the hypothesis, and HF's encode(s, h) with
// its OnlyFirst truncation when that is over MAX_LENGTH; with full, every
// pair is HF's encode(s, h). main checks the two agree.
async function encodeChunk(tk, json, encoding, sentences, full) {
  const tok = tk.Tokenizer.fromString(json);
  tok.disablePadding();
  tok.disableTruncation();
  if (encoding === 'pair') {
    const trunc = tk.Tokenizer.fromString(json);
    trunc.disablePadding();
    trunc.setTruncation(MAX_LENGTH, { strategy: 'OnlyFirst' });
    if (full) {
      const encs = await Promise.all(sentences.flatMap((s) => HYPOTHESES.map((h) => trunc.encode(s, h, { addSpecialTokens: true }))));
      return encs.map((e) => [e.getIds(), e.getTypeIds(), null]);
    }
    const prem = await tok.encodeBatch(sentences, { addSpecialTokens: false });
    const hyps = await tok.encodeBatch(HYPOTHESES, { addSpecialTokens: false });
    const out = [];
    for (const [i, s] of sentences.entries()) {
      for (const [j, h] of HYPOTHESES.entries()) {
        let e = tok.postProcess(prem[i], hyps[j], true);
        if (e.getLength() > MAX_LENGTH) e = await trunc.encode(s, h, { addSpecialTokens: true });
        out.push([e.getIds(), e.getTypeIds(), null]);
      }
    }
    return out;
  }
  const inputs = sentences.flatMap((s) => HYPOTHESES.map((h) => s + SEPARATOR + h));
  const encs = await tok.encodeBatch(inputs, { addSpecialTokens: true });
  const out = [];
  for (const [k, e] of encs.entries()) {
    const s = sentences[Math.floor(k / HYPOTHESES.length)];
    const { enc, kept } = await encodeJoined(tok, s, SEPARATOR, HYPOTHESES[k % HYPOTHESES.length], MAX_LENGTH, e);
    out.push([enc.getIds(), enc.getTypeIds(), kept]);
  }
  return out;
}

async function dump(name, encoding, chunk) {
  const src = sources().find((s) => s.name === name);
  if (!src) throw new Error(`no tokenizer ${name}`);
  const sentences = [...chunks()][chunk];
  const cases = await encodeChunk(anush, tokenizerJSON(src.source), encoding, sentences, true);
  process.stdout.write(JSON.stringify({ tokenizer: name, source: src.source, encoding, chunk, separator: SEPARATOR, max_length: MAX_LENGTH }) + '\n');
  cases.forEach(([ids, typeIds, kept], k) => {
    process.stdout.write(JSON.stringify({ sentence: sentences[Math.floor(k / HYPOTHESES.length)], hypothesis: HYPOTHESES[k % HYPOTHESES.length], premise_chars_kept: kept, input_ids: ids, token_type_ids: typeIds }) + '\n');
  });
}

// entry computes one tokenizer's digests in both encodings.
async function entry(src, all) {
  const json = tokenizerJSON(src.source);
  const stride = JSON.parse(json).model.type === 'Unigram' ? UNIGRAM_STRIDE : BPE_STRIDE;
  const e = { stride, name: src.name, source: src.source, also: src.also, sha256: crypto.createHash('sha256').update(fs.readFileSync(resolve(src.source))).digest('hex') };
  // CORPUS_REUSE=1 keeps the digests the current file already has for the
  // same tokenizer bytes (made and cross-checked before), so a smaller
  // stride adds only the chunks it lacks.
  let prev = null;
  if (process.env.CORPUS_REUSE === '1' && fs.existsSync(outFile)) {
    prev = JSON.parse(fs.readFileSync(outFile, 'utf8')).tokenizers.find((t) => t.name === e.name && t.sha256 === e.sha256) ?? null;
  }
  for (const encoding of ['pair', 'joined']) {
    const perLib = [];
    const old = prev?.[encoding] ?? [];
    let cut = encoding === 'joined' && prev ? prev.joined_premises_cut ?? 0 : 0;
    const t0 = Date.now();
    for (const [li, [, tk]] of LIBS.entries()) {
      const digests = [];
      for (const [k, ss] of all.entries()) {
        if (k % stride !== 0) { digests.push(''); continue; }
        if (old[k]) { digests.push(old[k]); continue; }
        if (li > 0 && k % Math.max(CROSS_CHECK, stride) !== 0) { digests.push(perLib[0][k]); continue; }
        const h = crypto.createHash('sha256');
        for (const [ids, typeIds, kept] of await encodeChunk(tk, json, encoding, ss, li > 0)) {
          h.update(caseBytes(ids, typeIds));
          if (kept !== null && li === 0) cut++;
        }
        digests.push(hex(h));
      }
      perLib.push(digests);
    }
    const bad = perLib[1].findIndex((d, i) => d !== perLib[0][i]);
    if (bad >= 0) throw new Error(`${src.name} ${encoding}: ${LIBS[0][0]} and ${LIBS[1][0]} differ in chunk ${bad}`);
    e[encoding] = perLib[0];
    if (encoding === 'joined') e.joined_premises_cut = cut;
    console.error(`${src.name} ${encoding}: ${Math.ceil(all.length / stride)} of ${all.length} chunks, ${LIBS[1][0]} agrees on every ${CROSS_CHECK}th${encoding === 'joined' ? `, ${cut} premises cut` : ''} (${((Date.now() - t0) / 1000).toFixed(0)} s)`);
  }
  return e;
}

// main runs one child process per tokenizer (CORPUS_JOBS at a time, 4 by
// default), each printing its entry as JSON, and writes the digest file.
async function main() {
  const all = [...chunks()];
  const sentenceDigests = all.map((ss) => {
    const h = crypto.createHash('sha256');
    for (const s of ss) h.update(Buffer.from(s + '\0', 'utf8'));
    return hex(h);
  });
  const srcs = sources();
  const results = new Array(srcs.length);
  const jobs = Number(process.env.CORPUS_JOBS) || 4;
  let next = 0;
  const worker = async () => {
    while (next < srcs.length) {
      const i = next++;
      results[i] = await new Promise((ok, fail) => {
        const child = spawn(process.execPath, [fileURLToPath(import.meta.url), '--entry', srcs[i].name], { stdio: ['ignore', 'pipe', 'inherit'] });
        let out = '';
        child.stdout.on('data', (d) => { out += d; });
        child.on('exit', (code) => (code === 0 ? ok(JSON.parse(out)) : fail(new Error(`${srcs[i].name}: exit ${code}`))));
      });
    }
  };
  await Promise.all(Array.from({ length: jobs }, worker));
  const digest = {
    generator: 'tools/golden/corpus.mjs',
    tokenizer_libs: LIBS.map(([n]) => n),
    corpus: 'data/transcripts/transcripts.jsonl',
    chunk_lines: CHUNK_LINES,
    sentences: all.reduce((n, ss) => n + ss.length, 0),
    hypotheses: HYPOTHESES,
    separator: SEPARATOR,
    max_length: MAX_LENGTH,
    cross_check_every: CROSS_CHECK,
    sentence_digests: sentenceDigests,
    tokenizers: results,
  };
  fs.writeFileSync(outFile, JSON.stringify(digest, null, 1) + '\n');
  console.log(`${digest.sentences} sentences x ${HYPOTHESES.length} hypotheses, ${results.length} tokenizers -> ${path.relative(repo, outFile)}`);
}

const args = process.argv.slice(2);
if (args[0] === '--entry') {
  const src = sources().find((x) => x.name === args[1]);
  entry(src, [...chunks()]).then((e) => process.stdout.write(JSON.stringify(e))).catch((e) => { console.error(e); process.exit(1); });
} else if (args[0] === '--dump') {
  dump(args[1], args[2], Number(args[3])).catch((e) => { console.error(e); process.exit(1); });
} else {
  main().catch((e) => { console.error(e); process.exit(1); });
}
