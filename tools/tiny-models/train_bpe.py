#!/usr/bin/python3
"""Learns a small byte-level BPE tokenizer (GPT-2/RoBERTa style) from the
transcript corpus and writes it in Hugging Face tokenizers' serialisation.

The npm binding of HF tokenizers loads and runs BPE but exposes no trainer,
so the merges are learnt here, stdlib only. The output is checked by loading
it with HF's own library (see check_tokenizer.mjs); that library, not this
script, is the reference for how text is encoded.

Usage: /usr/bin/python3 train_bpe.py CORPUS FAMILY=OUT_DIR [FAMILY=OUT_DIR...]
FAMILY is roberta or bart: the tokenizer.json is the same for both (as for
roberta-large-mnli and bart-large-mnli); tokenizer_config.json names the
family's tokenizer class and length. Deterministic: the same corpus gives the
same bytes.
"""
import heapq
import json
import os
import re
import sys

VOCAB_SIZE = 6000
# Every SAMPLE_EVERY-th transcript (all its sentences) is the training sample.
SAMPLE_EVERY = 5
SPECIALS = ["<s>", "<pad>", "</s>", "<unk>"]  # ids 0..3 as in RoBERTa/BART
MASK = "<mask>"  # last id, as in RoBERTa/BART
# tokenizer_config.json's class and model_max_length per family, as
# roberta-large-mnli and bart-large-mnli have them.
FAMILIES = {"roberta": ("RobertaTokenizer", 512), "bart": ("BartTokenizer", 1024)}


def bytes_to_unicode():
    """GPT-2's reversible byte -> printable character table."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


# GPT-2's pre-tokenization regex is
#   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
# Python's re has no \p{..}; [^\W\d_] stands for letters and \d for numbers.
# They differ from \p{L}/\p{N} on a few characters (combining marks count as
# \w, \d is only Nd). That only changes which merges are learnt here: HF's
# library applies the real regex when it encodes with the file written below.
PRETOKENIZE = re.compile(
    r"""'s|'t|'re|'ve|'m|'ll|'d| ?[^\W\d_]+| ?\d+| ?(?:[^\s\w]|_)+|\s+(?!\S)|\s+"""
)


def sentences(corpus):
    with open(corpus, encoding="utf-8") as f:
        for i, line in enumerate(f):
            if i % SAMPLE_EVERY:
                continue
            call = json.loads(line)
            for name in sorted(call["sections"]):
                for s in call["sections"][name]:
                    yield s


def word_counts(corpus, byte_map):
    counts = {}
    for s in sentences(corpus):
        for piece in PRETOKENIZE.findall(s):
            w = "".join(byte_map[b] for b in piece.encode("utf-8"))
            counts[w] = counts.get(w, 0) + 1
    return counts


def train(counts, n_merges):
    """Classic BPE: repeatedly merge the most frequent adjacent pair. Ties go
    to the lexicographically smallest pair so the result is deterministic."""
    words = [list(w) for w in sorted(counts)]
    freq = [counts[w] for w in sorted(counts)]
    pair_count = {}
    where = {}
    for i, w in enumerate(words):
        for a, b in zip(w, w[1:]):
            pair_count[(a, b)] = pair_count.get((a, b), 0) + freq[i]
            where.setdefault((a, b), set()).add(i)
    heap = [(-c, p) for p, c in pair_count.items()]
    heapq.heapify(heap)
    merges = []
    while len(merges) < n_merges and heap:
        c, p = heapq.heappop(heap)
        cur = pair_count.get(p, 0)
        if cur <= 0:
            continue
        if -c != cur:  # stale entry: requeue with its current count
            heapq.heappush(heap, (-cur, p))
            continue
        merges.append(p)
        a, b = p
        ab = a + b
        touched = set()
        for i in sorted(where.pop(p, ())):
            w = words[i]
            f = freq[i]
            for x, y in zip(w, w[1:]):
                pair_count[(x, y)] -= f
            out = []
            j = 0
            while j < len(w):
                if j + 1 < len(w) and w[j] == a and w[j + 1] == b:
                    out.append(ab)
                    j += 2
                else:
                    out.append(w[j])
                    j += 1
            words[i] = out
            for x, y in zip(out, out[1:]):
                pair_count[(x, y)] = pair_count.get((x, y), 0) + f
                where.setdefault((x, y), set()).add(i)
                touched.add((x, y))
        pair_count.pop(p, None)
        for q in sorted(touched):
            if pair_count.get(q, 0) > 0:
                heapq.heappush(heap, (-pair_count[q], q))
    return merges


def added(i, content, lstrip=False, normalized=True):
    return {
        "id": i,
        "content": content,
        "single_word": False,
        "lstrip": lstrip,
        "rstrip": False,
        "normalized": normalized,
        "special": True,
    }


def main():
    if len(sys.argv) < 3:
        sys.exit("usage: train_bpe.py CORPUS FAMILY=OUT_DIR [FAMILY=OUT_DIR...]")
    corpus = sys.argv[1]
    outs = [a.split("=", 1) for a in sys.argv[2:]]
    for o in outs:
        if len(o) != 2 or o[0] not in FAMILIES:
            sys.exit("bad output %r: want roberta=DIR or bart=DIR" % "=".join(o))
    byte_map = bytes_to_unicode()
    alphabet = [byte_map[b] for b in range(256)]
    n_merges = VOCAB_SIZE - len(SPECIALS) - len(alphabet) - 1
    merges = train(word_counts(corpus, byte_map), n_merges)
    vocab = {}
    for t in SPECIALS + alphabet + [a + b for a, b in merges] + [MASK]:
        if t not in vocab:  # two merges can spell the same string
            vocab[t] = len(vocab)
    mask_id = vocab[MASK]
    tok = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [added(i, t) for i, t in enumerate(SPECIALS)]
        + [added(mask_id, MASK, lstrip=True, normalized=False)],
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
        "post_processor": {
            "type": "RobertaProcessing",
            "sep": ["</s>", 2],
            "cls": ["<s>", 0],
            "trim_offsets": True,
            "add_prefix_space": False,
        },
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": vocab,
            "merges": [[a, b] for a, b in merges],
        },
    }
    spec = {t["content"]: t for t in tok["added_tokens"]}
    config = {
        "add_prefix_space": False,
        "added_tokens_decoder": {
            str(t["id"]): {k: t[k] for k in ("content", "lstrip", "normalized", "rstrip", "single_word", "special")}
            for t in tok["added_tokens"]
        },
        "bos_token": "<s>",
        "clean_up_tokenization_spaces": False,
        "cls_token": "<s>",
        "eos_token": "</s>",
        "errors": "replace",
        "extra_special_tokens": {},
        "mask_token": MASK,
        "model_max_length": 512,
        "pad_token": "<pad>",
        "sep_token": "</s>",
        "tokenizer_class": "RobertaTokenizer",
        "trim_offsets": True,
        "unk_token": "<unk>",
    }

    def entry(name):
        t = spec[name]
        return {k: t[k] for k in ("content", "lstrip", "normalized", "rstrip", "single_word")}

    special_map = {
        "bos_token": entry("<s>"),
        "cls_token": entry("<s>"),
        "eos_token": entry("</s>"),
        "mask_token": entry(MASK),
        "pad_token": entry("<pad>"),
        "sep_token": entry("</s>"),
        "unk_token": entry("<unk>"),
    }
    for family, out in outs:
        config["tokenizer_class"], config["model_max_length"] = FAMILIES[family]
        os.makedirs(out, exist_ok=True)
        # HF tokenizers' save(pretty) ends tokenizer.json without a newline;
        # transformers ends its own json files with one.
        for name, obj, end in (
            ("tokenizer.json", tok, ""),
            ("tokenizer_config.json", config, "\n"),
            ("special_tokens_map.json", special_map, "\n"),
        ):
            with open(os.path.join(out, name), "w", encoding="utf-8", newline="\n") as f:
                json.dump(obj, f, ensure_ascii=False, indent=2)
                f.write(end)
    print("vocab %d (merges %d, <mask> = %d)" % (len(vocab), len(merges), mask_id), file=sys.stderr)


if __name__ == "__main__":
    main()
