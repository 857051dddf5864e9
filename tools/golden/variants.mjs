// Writes testdata/tokenizers/<name>/variant.json: tokenizer.json variants of
// the families no file here has (ModernBERT's [CLS]/[SEP] byte-level BPE,
// a Llama-3-style Split + ByteLevel export, XLM-R's and mDeBERTa-v3's
// SentencePiece pipelines), each made from a tokenizer.json that is here by
// replacing some of its top-level fields, as those families' files have
// them. A variant is { base, base_sha256, set }: the base file (a path from
// the repository root, or "shared:" + a path under ../shared), its SHA-256,
// and the fields to replace. Only the fields are committed; the DeBERTa-v3
// base alone is 8.6 MB. overlay.mjs (here) and the Go tests
// (model/tokenizer/corpus_test.go) build the same tokenizer.json from them.
//
// Usage: node variants.mjs   (from tools/golden; `make golden` runs it)
import fs from 'node:fs';
import path from 'node:path';
import { repo, readBase } from './overlay.mjs';

const ROBERTA = 'testdata/models/nli-roberta-bpe-tiny/tokenizer.json';
const DEBERTA = 'shared:models/deberta-v3-tokenizer/tokenizer.json';

// Llama 3's pre-tokenizer pattern (as its tokenizer.json stores it): case-
// insensitive contractions, numbers in threes, and GPT-2's \s+(?!\S).
const LLAMA3 = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

const special = (id, content, extra = {}) => ({ id, content, single_word: false, lstrip: false, rstrip: false, normalized: false, special: true, ...extra });
const tmpl = (cls, sep, pair) => ({
  type: 'TemplateProcessing',
  single: [{ SpecialToken: { id: cls.content, type_id: 0 } }, { Sequence: { id: 'A', type_id: 0 } }, { SpecialToken: { id: sep.content, type_id: 0 } }],
  pair,
  special_tokens: {
    [cls.content]: { id: cls.content, ids: [cls.id], tokens: [cls.content] },
    [sep.content]: { id: sep.content, ids: [sep.id], tokens: [sep.content] },
  },
});

function variants() {
  const roberta = readBase(ROBERTA).json;
  const deberta = readBase(DEBERTA).json;
  const next = Math.max(...Object.values(roberta.model.vocab), ...roberta.added_tokens.map((a) => a.id)) + 1;
  // ModernBERT: OLMo's byte-level BPE with BERT's specials appended after
  // the vocabulary, [MASK] stripping the space before it, an NFC
  // normalizer, no prefix space, and [CLS] A [SEP] B [SEP].
  const [unk, cls, sep, pad, mask] = ['[UNK]', '[CLS]', '[SEP]', '[PAD]', '[MASK]'].map((c, i) => special(next + i, c, c === '[MASK]' ? { lstrip: true } : {}));
  const ip = { ...special(next + 5, '|||IP_ADDRESS|||'), normalized: true, special: false };
  const modernbert = {
    added_tokens: [...roberta.added_tokens, unk, cls, sep, pad, mask, ip],
    normalizer: { type: 'NFC' },
    pre_tokenizer: { type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: true },
    post_processor: tmpl(cls, sep, [
      { SpecialToken: { id: '[CLS]', type_id: 0 } }, { Sequence: { id: 'A', type_id: 0 } }, { SpecialToken: { id: '[SEP]', type_id: 0 } },
      { Sequence: { id: 'B', type_id: 1 } }, { SpecialToken: { id: '[SEP]', type_id: 1 } },
    ]),
    padding: { strategy: 'BatchLongest', direction: 'Right', pad_to_multiple_of: null, pad_id: pad.id, pad_type_id: 0, pad_token: '[PAD]' },
  };
  // A Llama-3-style export: Split with the pattern, then ByteLevel without
  // its own regex; the post-processor a Sequence of ByteLevel (offsets) and
  // the RoBERTa layout as a template.
  const s = roberta.added_tokens.find((a) => a.content === '<s>');
  const e = roberta.added_tokens.find((a) => a.content === '</s>');
  const splitBPE = {
    pre_tokenizer: {
      type: 'Sequence',
      pretokenizers: [
        { type: 'Split', pattern: { Regex: LLAMA3 }, behavior: 'Isolated', invert: false },
        { type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: false },
      ],
    },
    post_processor: {
      type: 'Sequence',
      processors: [
        { type: 'ByteLevel', add_prefix_space: true, trim_offsets: false, use_regex: true },
        tmpl(s, e, [
          { SpecialToken: { id: '<s>', type_id: 0 } }, { Sequence: { id: 'A', type_id: 0 } }, { SpecialToken: { id: '</s>', type_id: 0 } },
          { SpecialToken: { id: '</s>', type_id: 0 } }, { Sequence: { id: 'B', type_id: 0 } }, { SpecialToken: { id: '</s>', type_id: 0 } },
        ]),
      ],
    },
  };
  const seq = deberta.normalizer.normalizers;
  const precompiled = seq.find((n) => n.type === 'Precompiled');
  const spaces = seq.find((n) => n.type === 'Replace');
  // XLM-RoBERTa: the charsmap alone, Metaspace as files before
  // prepend_scheme wrote it (add_prefix_space), <s> A </s></s> B </s>
  // (DeBERTa-v3's [CLS] and [SEP] ids stand in for <s> and </s>).
  const xlmr = {
    normalizer: precompiled,
    pre_tokenizer: { type: 'Metaspace', replacement: '\u2581', add_prefix_space: true },
    post_processor: { type: 'RobertaProcessing', sep: ['[SEP]', 2], cls: ['[CLS]', 1], trim_offsets: true, add_prefix_space: true },
  };
  // mDeBERTa-v3 as transformers converts it with legacy=False: prepend
  // only at the start of the text ("first"), words split.
  const mdeberta = {
    pre_tokenizer: { type: 'Metaspace', replacement: '\u2581', prepend_scheme: 'first', split: true },
  };
  // Metaspace that never prepends and keeps one piece, after a normalizer
  // without Strip.
  const never = {
    normalizer: { type: 'Sequence', normalizers: [precompiled, spaces] },
    pre_tokenizer: { type: 'Metaspace', replacement: '\u2581', prepend_scheme: 'never', split: false },
  };
  return [
    ['modernbert-bpe', ROBERTA, modernbert],
    ['split-bpe', ROBERTA, splitBPE],
    ['xlm-roberta-unigram', DEBERTA, xlmr],
    ['mdeberta-v3-unigram', DEBERTA, mdeberta],
    ['metaspace-never-unigram', DEBERTA, never],
  ];
}

for (const [name, base, set] of variants()) {
  const dir = path.join(repo, 'testdata', 'tokenizers', name);
  fs.mkdirSync(dir, { recursive: true });
  const file = path.join(dir, 'variant.json');
  fs.writeFileSync(file, JSON.stringify({ base, base_sha256: readBase(base).sha256, set }, null, 1) + '\n');
  console.log(`${path.relative(repo, file)}: ${Object.keys(set).join(', ')} of ${base}`);
}
