// Resolves the tokenizer files the corpus references cover: a tokenizer.json
// in the repository or under ../shared, or a variant (variants.mjs) built by
// replacing top-level fields of one. model/tokenizer/corpus_test.go does the
// same in Go.
import crypto from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
export const repo = path.resolve(here, '..', '..');
export const shared = process.env.SHARED_DIR ? path.resolve(process.env.SHARED_DIR) : path.resolve(repo, '..', 'shared');

// resolve is the file a source names: "shared:" + a path under ../shared,
// else a path from the repository root.
export function resolve(source) {
  return source.startsWith('shared:') ? path.join(shared, source.slice('shared:'.length)) : path.join(repo, source);
}

export function readBase(source) {
  const bytes = fs.readFileSync(resolve(source));
  return { json: JSON.parse(bytes.toString('utf8')), sha256: crypto.createHash('sha256').update(bytes).digest('hex') };
}

// tokenizerJSON is the tokenizer.json text of a source: the file itself, or
// for a variant.json its base with the fields replaced (failing when the
// base changed since the variant was written).
export function tokenizerJSON(source) {
  if (!source.endsWith('variant.json')) return fs.readFileSync(resolve(source), 'utf8');
  const v = JSON.parse(fs.readFileSync(resolve(source), 'utf8'));
  const base = readBase(v.base);
  if (base.sha256 !== v.base_sha256) throw new Error(`${source}: ${v.base} changed since the variant was written (run node variants.mjs)`);
  return JSON.stringify({ ...base.json, ...v.set });
}
