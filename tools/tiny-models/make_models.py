#!/usr/bin/python3
"""Builds the two tiny random-weight NLI models the scorer's tests run on the
byte-level BPE families, and their torch references.

  nli-roberta-bpe-tiny: RobertaForSequenceClassification
  nli-bart-bpe-tiny:    BartForSequenceClassification

transformers is not installed here, so the modules are written in plain torch,
following transformers' modeling_roberta.py and modeling_bart.py (eval mode:
dropout off) with HF's parameter names. The weights are random (fixed seed):
the models say nothing about NLI; they exercise the graph shapes, inputs and
heads that real roberta-large-mnli / bart-large-mnli exports have.

Usage: /usr/bin/python3 make_models.py PAIRS_JSON OUT_ROOT
PAIRS_JSON is encode_pairs.mjs's output (HF tokenizers' ids); OUT_ROOT holds
the two model folders, which already have the tokenizer files of
train_bpe.py. Writes config.json, onnx/model.onnx and torch-logits.json in
each.
"""
import hashlib
import json
import math
import os
import sys

import onnx
import torch
from torch import nn

PAD, BOS, EOS = 1, 0, 2
SEED = 47
OPSET = 14
# Wide enough that random logits spread over the classes (HF's 0.02 would
# give near-equal logits and the same decision for every input).
INIT_STD = 0.2
EMBED_STD = 1.0
HEAD_STD = 0.5
NEG = torch.finfo(torch.float32).min


def init_weights(module):
    for m in module.modules():
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, std=INIT_STD)
            nn.init.normal_(m.bias, std=0.1)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, std=EMBED_STD)
            if m.padding_idx is not None:
                with torch.no_grad():
                    m.weight[m.padding_idx].zero_()
        elif isinstance(m, nn.LayerNorm):
            nn.init.normal_(m.weight, mean=1.0, std=0.1)
            nn.init.normal_(m.bias, std=0.1)
    for m in module.modules():
        if isinstance(m, ClassificationHead):
            nn.init.normal_(m.out_proj.weight, std=HEAD_STD)


def key_mask(attention_mask):
    """HF's extended attention mask: 0 where attended, float32 min where not."""
    return (1.0 - attention_mask[:, None, None, :].to(torch.float32)) * NEG


# ---------------------------------------------------------------- RoBERTa


class RobertaEmbeddings(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.word_embeddings = nn.Embedding(c["vocab_size"], c["hidden_size"], padding_idx=PAD)
        self.position_embeddings = nn.Embedding(c["max_position_embeddings"], c["hidden_size"], padding_idx=PAD)
        self.token_type_embeddings = nn.Embedding(c["type_vocab_size"], c["hidden_size"])
        self.LayerNorm = nn.LayerNorm(c["hidden_size"], eps=c["layer_norm_eps"])

    def forward(self, input_ids):
        # create_position_ids_from_input_ids: positions count non-pad tokens
        # from padding_idx + 1; pad tokens get padding_idx.
        mask = input_ids.ne(PAD).int()
        position_ids = (torch.cumsum(mask, dim=1).type_as(mask) * mask).long() + PAD
        # No token_type_ids input: type 0 everywhere, as HF's buffer gives.
        token_type_ids = torch.zeros_like(input_ids)
        x = self.word_embeddings(input_ids) + self.token_type_embeddings(token_type_ids)
        x = x + self.position_embeddings(position_ids)
        return self.LayerNorm(x)


class RobertaSelfAttention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.heads = c["num_attention_heads"]
        self.head_dim = c["hidden_size"] // self.heads
        self.query = nn.Linear(c["hidden_size"], c["hidden_size"])
        self.key = nn.Linear(c["hidden_size"], c["hidden_size"])
        self.value = nn.Linear(c["hidden_size"], c["hidden_size"])

    def split(self, x):
        b, l, _ = x.shape
        return x.view(b, l, self.heads, self.head_dim).transpose(1, 2)

    def forward(self, x, mask):
        q, k, v = self.split(self.query(x)), self.split(self.key(x)), self.split(self.value(x))
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.head_dim) + mask
        ctx = torch.matmul(torch.softmax(scores, dim=-1), v)
        b, _, l, _ = ctx.shape
        return ctx.transpose(1, 2).reshape(b, l, self.heads * self.head_dim)


class RobertaSelfOutput(nn.Module):
    def __init__(self, c, inner):
        super().__init__()
        self.dense = nn.Linear(inner, c["hidden_size"])
        self.LayerNorm = nn.LayerNorm(c["hidden_size"], eps=c["layer_norm_eps"])

    def forward(self, h, residual):
        return self.LayerNorm(self.dense(h) + residual)


class RobertaAttention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.self = RobertaSelfAttention(c)
        self.output = RobertaSelfOutput(c, c["hidden_size"])

    def forward(self, x, mask):
        return self.output(self.self(x, mask), x)


class RobertaIntermediate(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.dense = nn.Linear(c["hidden_size"], c["intermediate_size"])

    def forward(self, x):
        return nn.functional.gelu(self.dense(x))  # "gelu": the erf form


class RobertaLayer(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.attention = RobertaAttention(c)
        self.intermediate = RobertaIntermediate(c)
        self.output = RobertaSelfOutput(c, c["intermediate_size"])

    def forward(self, x, mask):
        a = self.attention(x, mask)
        return self.output(self.intermediate(a), a)


class RobertaEncoder(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.layer = nn.ModuleList(RobertaLayer(c) for _ in range(c["num_hidden_layers"]))

    def forward(self, x, mask):
        for layer in self.layer:
            x = layer(x, mask)
        return x


class RobertaModel(nn.Module):
    # add_pooling_layer=False, as RobertaForSequenceClassification builds it.
    def __init__(self, c):
        super().__init__()
        self.embeddings = RobertaEmbeddings(c)
        self.encoder = RobertaEncoder(c)

    def forward(self, input_ids, attention_mask):
        return self.encoder(self.embeddings(input_ids), key_mask(attention_mask))


class ClassificationHead(nn.Module):
    """RobertaClassificationHead and BartClassificationHead: dense, tanh,
    out_proj (dropout off)."""

    def __init__(self, hidden, labels):
        super().__init__()
        self.dense = nn.Linear(hidden, hidden)
        self.out_proj = nn.Linear(hidden, labels)

    def forward(self, x):
        return self.out_proj(torch.tanh(self.dense(x)))


class RobertaForSequenceClassification(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.roberta = RobertaModel(c)
        self.classifier = ClassificationHead(c["hidden_size"], len(c["id2label"]))

    def forward(self, input_ids, attention_mask):
        h = self.roberta(input_ids, attention_mask)
        return self.classifier(h[:, 0, :])  # the <s> token


# ---------------------------------------------------------------- BART


class BartLearnedPositionalEmbedding(nn.Embedding):
    OFFSET = 2  # fairseq's: ids 0 and 1 of the table are never used

    def __init__(self, num, dim):
        super().__init__(num + self.OFFSET, dim)

    def forward(self, input_ids):
        b, l = input_ids.shape
        positions = torch.arange(l, dtype=torch.long, device=input_ids.device).expand(b, -1)
        return super().forward(positions + self.OFFSET)


class BartAttention(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.heads, self.head_dim = heads, dim // heads
        self.scaling = self.head_dim ** -0.5
        self.k_proj = nn.Linear(dim, dim)
        self.v_proj = nn.Linear(dim, dim)
        self.q_proj = nn.Linear(dim, dim)
        self.out_proj = nn.Linear(dim, dim)

    def split(self, x):
        b, l, _ = x.shape
        return x.view(b, l, self.heads, self.head_dim).transpose(1, 2)

    def forward(self, x, kv, mask):
        q = self.split(self.q_proj(x) * self.scaling)
        k, v = self.split(self.k_proj(kv)), self.split(self.v_proj(kv))
        w = torch.softmax(torch.matmul(q, k.transpose(-1, -2)) + mask, dim=-1)
        ctx = torch.matmul(w, v)
        b, _, l, _ = ctx.shape
        return self.out_proj(ctx.transpose(1, 2).reshape(b, l, self.heads * self.head_dim))


class BartEncoderLayer(nn.Module):
    def __init__(self, c):
        super().__init__()
        d = c["d_model"]
        self.self_attn = BartAttention(d, c["encoder_attention_heads"])
        self.self_attn_layer_norm = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, c["encoder_ffn_dim"])
        self.fc2 = nn.Linear(c["encoder_ffn_dim"], d)
        self.final_layer_norm = nn.LayerNorm(d)

    def forward(self, x, mask):
        x = self.self_attn_layer_norm(x + self.self_attn(x, x, mask))
        return self.final_layer_norm(x + self.fc2(nn.functional.gelu(self.fc1(x))))


class BartDecoderLayer(nn.Module):
    def __init__(self, c):
        super().__init__()
        d = c["d_model"]
        self.self_attn = BartAttention(d, c["decoder_attention_heads"])
        self.self_attn_layer_norm = nn.LayerNorm(d)
        self.encoder_attn = BartAttention(d, c["decoder_attention_heads"])
        self.encoder_attn_layer_norm = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, c["decoder_ffn_dim"])
        self.fc2 = nn.Linear(c["decoder_ffn_dim"], d)
        self.final_layer_norm = nn.LayerNorm(d)

    def forward(self, x, causal, enc, enc_mask):
        x = self.self_attn_layer_norm(x + self.self_attn(x, x, causal))
        x = self.encoder_attn_layer_norm(x + self.encoder_attn(x, enc, enc_mask))
        return self.final_layer_norm(x + self.fc2(nn.functional.gelu(self.fc1(x))))


class BartEncoder(nn.Module):
    def __init__(self, c, embed_tokens):
        super().__init__()
        self.embed_tokens = embed_tokens
        self.embed_positions = BartLearnedPositionalEmbedding(c["max_position_embeddings"], c["d_model"])
        self.layers = nn.ModuleList(BartEncoderLayer(c) for _ in range(c["encoder_layers"]))
        self.layernorm_embedding = nn.LayerNorm(c["d_model"])

    def forward(self, input_ids, mask):
        # scale_embedding false: embed_scale 1.0
        x = self.layernorm_embedding(self.embed_tokens(input_ids) + self.embed_positions(input_ids))
        for layer in self.layers:
            x = layer(x, mask)
        return x


class BartDecoder(nn.Module):
    def __init__(self, c, embed_tokens):
        super().__init__()
        self.embed_tokens = embed_tokens
        self.embed_positions = BartLearnedPositionalEmbedding(c["max_position_embeddings"], c["d_model"])
        self.layers = nn.ModuleList(BartDecoderLayer(c) for _ in range(c["decoder_layers"]))
        self.layernorm_embedding = nn.LayerNorm(c["d_model"])

    def forward(self, decoder_input_ids, enc, enc_mask):
        x = self.layernorm_embedding(self.embed_tokens(decoder_input_ids) + self.embed_positions(decoder_input_ids))
        # No decoder_attention_mask is passed (as in HF's classification
        # forward): the decoder's self-attention is causal only.
        l = decoder_input_ids.shape[1]
        causal = torch.triu(torch.full((l, l), NEG), diagonal=1)[None, None, :, :]
        for layer in self.layers:
            x = layer(x, causal, enc, enc_mask)
        return x


def shift_tokens_right(input_ids, pad_token_id, decoder_start_token_id):
    start = torch.full_like(input_ids[:, :1], decoder_start_token_id)
    shifted = torch.cat([start, input_ids[:, :-1]], dim=1)
    return shifted.masked_fill(shifted == -100, pad_token_id)


class BartModel(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.shared = nn.Embedding(c["vocab_size"], c["d_model"], padding_idx=PAD)
        self.encoder = BartEncoder(c, self.shared)
        self.decoder = BartDecoder(c, self.shared)
        self.c = c

    def forward(self, input_ids, attention_mask):
        # BartModel.forward with decoder_input_ids None: the decoder reads the
        # input shifted right behind decoder_start_token_id, inside the graph.
        dec_ids = shift_tokens_right(input_ids, self.c["pad_token_id"], self.c["decoder_start_token_id"])
        mask = key_mask(attention_mask)
        return self.decoder(dec_ids, self.encoder(input_ids, mask), mask)


class BartForSequenceClassification(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.model = BartModel(c)
        self.classification_head = ClassificationHead(c["d_model"], len(c["id2label"]))

    def forward(self, input_ids, attention_mask):
        h = self.model(input_ids, attention_mask)
        # HF: the hidden state of each row's last </s>. HF raises when rows
        # hold different numbers of </s>; the exported graph (like optimum's
        # exports of bart-large-mnli) has no such check: the Reshape fails or
        # rows mix, so such a batch must not reach it.
        eos_mask = input_ids.eq(EOS)
        rep = h[eos_mask, :].view(h.size(0), -1, h.size(-1))[:, -1, :]
        return self.classification_head(rep)


# ---------------------------------------------------------------- configs


def roberta_config(vocab):
    return {
        "architectures": ["RobertaForSequenceClassification"],
        "attention_probs_dropout_prob": 0.1,
        "bos_token_id": BOS,
        "classifier_dropout": None,
        "eos_token_id": EOS,
        "hidden_act": "gelu",
        "hidden_dropout_prob": 0.1,
        "hidden_size": 64,
        "id2label": {"0": "CONTRADICTION", "1": "NEUTRAL", "2": "ENTAILMENT"},
        "initializer_range": INIT_STD,
        "intermediate_size": 128,
        "label2id": {"CONTRADICTION": 0, "ENTAILMENT": 2, "NEUTRAL": 1},
        "layer_norm_eps": 1e-05,
        "max_position_embeddings": 514,
        "model_type": "roberta",
        "num_attention_heads": 4,
        "num_hidden_layers": 2,
        "pad_token_id": PAD,
        "position_embedding_type": "absolute",
        "torch_dtype": "float32",
        "type_vocab_size": 1,
        "use_cache": True,
        "vocab_size": vocab,
    }


def bart_config(vocab):
    return {
        "activation_dropout": 0.0,
        "activation_function": "gelu",
        "architectures": ["BartForSequenceClassification"],
        "attention_dropout": 0.0,
        "bos_token_id": BOS,
        "classif_dropout": 0.0,
        "classifier_dropout": 0.0,
        "d_model": 64,
        "decoder_attention_heads": 4,
        "decoder_ffn_dim": 128,
        "decoder_layerdrop": 0.0,
        "decoder_layers": 2,
        "decoder_start_token_id": EOS,
        "dropout": 0.1,
        "encoder_attention_heads": 4,
        "encoder_ffn_dim": 128,
        "encoder_layerdrop": 0.0,
        "encoder_layers": 2,
        "eos_token_id": EOS,
        "forced_eos_token_id": EOS,
        "id2label": {"0": "contradiction", "1": "neutral", "2": "entailment"},
        "init_std": INIT_STD,
        "is_encoder_decoder": True,
        "label2id": {"contradiction": 0, "entailment": 2, "neutral": 1},
        "max_position_embeddings": 1024,
        "model_type": "bart",
        "num_hidden_layers": 2,
        "pad_token_id": PAD,
        "scale_embedding": False,
        "torch_dtype": "float32",
        "use_cache": True,
        "vocab_size": vocab,
    }


FAMILIES = [
    ("nli-roberta-bpe-tiny", roberta_config, RobertaForSequenceClassification),
    ("nli-bart-bpe-tiny", bart_config, BartForSequenceClassification),
]


def padded(rows):
    """Right-padded batch (pad id 1) and its attention mask."""
    n = max(len(r) for r in rows)
    ids = torch.full((len(rows), n), PAD, dtype=torch.long)
    mask = torch.zeros((len(rows), n), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(r)
        mask[i, : len(r)] = 1
    return ids, mask


def eos_count(row):
    return sum(1 for t in row if t == EOS)


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: make_models.py PAIRS_JSON OUT_ROOT")
    pairs = json.load(open(sys.argv[1], encoding="utf-8"))
    root = sys.argv[2]
    torch.use_deterministic_algorithms(True)
    for name, make_config, cls in FAMILIES:
        out = os.path.join(root, name)
        tok = json.load(open(os.path.join(out, "tokenizer.json"), encoding="utf-8"))
        vocab = len(tok["model"]["vocab"])
        c = make_config(vocab)
        torch.manual_seed(SEED)
        model = cls(c)
        init_weights(model)
        model.eval()

        with torch.no_grad():
            # Centre the random head on the sample: out_proj's bias cancels the
            # mean logit of every class, so each class wins for some inputs
            # (random encoders give every input much the same <s> or </s>
            # state, and one class would win everywhere).
            all_rows = [r for per in pairs["pair"] for r in per]
            mean = torch.stack([model(*padded([r]))[0] for r in all_rows]).mean(dim=0)
            head = model.classifier if hasattr(model, "classifier") else model.classification_head
            head.out_proj.bias -= mean

        logits = {}
        with torch.no_grad():
            for enc in ("pair", "joined"):
                rows = [r for per in pairs[enc] for r in per]
                # One row at a time, as HF's pipeline runs them: the reference.
                single = [model(*padded([r]))[0] for r in rows]
                # A right-padded batch of rows with the same </s> count must
                # give the same logits (padding is masked everywhere).
                same = [i for i, r in enumerate(rows) if eos_count(r) == 3]
                batch = model(*padded([rows[i] for i in same]))
                for j, i in enumerate(same):
                    d = (batch[j] - single[i]).abs().max().item()
                    if d > 1e-4:
                        sys.exit("%s %s row %d: padded batch differs by %g" % (name, enc, i, d))
                n = len(pairs["hypotheses"])
                logits[enc] = [[single[s * n + h].tolist() for h in range(n)] for s in range(len(pairs["sentences"]))]

        flat = torch.tensor([l for per in logits["pair"] for l in per])
        winners = flat.argmax(dim=1).bincount(minlength=3).tolist()
        if min(winners) == 0:
            sys.exit("%s: some class never wins (%s): widen the init" % (name, winners))

        os.makedirs(os.path.join(out, "onnx"), exist_ok=True)
        onnx_path = os.path.join(out, "onnx", "model.onnx")
        example = padded(pairs["pair"][0])
        torch.onnx.export(
            model,
            example,
            onnx_path,
            input_names=["input_ids", "attention_mask"],
            output_names=["logits"],
            dynamic_axes={
                "input_ids": {0: "batch", 1: "sequence"},
                "attention_mask": {0: "batch", 1: "sequence"},
                "logits": {0: "batch"},
            },
            opset_version=OPSET,
            do_constant_folding=True,
        )
        onnx.checker.check_model(onnx.load(onnx_path))

        with open(os.path.join(out, "config.json"), "w", encoding="utf-8") as f:
            # save_pretrained's layout: sorted keys, indent 2, final newline.
            f.write(json.dumps(c, indent=2, sort_keys=True) + "\n")
        ref = {
            "what": "logits of the torch module onnx/model.onnx was exported from, each pair run alone (batch 1); ids from HF tokenizers",
            "tokenizers": pairs["tokenizers"],
            "torch": torch.__version__,
            "labels": pairs["labels"],
            "hypothesis_template": pairs["hypothesis_template"],
            "pair_separator": pairs["pair_separator"],
            "id2label": c["id2label"],
            "sentences": pairs["sentences"],
            "hypotheses": pairs["hypotheses"],
            "ids": {"pair": pairs["pair"], "joined": pairs["joined"]},
            "logits": logits,
        }
        with open(os.path.join(out, "torch-logits.json"), "w", encoding="utf-8") as f:
            f.write(json.dumps(ref, ensure_ascii=False) + "\n")
        params = sum(p.numel() for p in model.parameters())
        write_source(out, name, c, params, winners, pairs)
        print("%s: %d parameters, argmax counts %s" % (name, params, winners), file=sys.stderr)


ABOUT = {
    "nli-roberta-bpe-tiny": """RobertaForSequenceClassification, as transformers' modeling_roberta.py builds it:
post-LayerNorm encoder (eps 1e-5), GELU (erf), learned absolute positions numbered from the input
ids as create_position_ids_from_input_ids does (non-pad tokens count from padding_idx + 1 = 2, pad
tokens get 1; max_position_embeddings 514), one token type added inside (no token_type_ids input),
no pooler; classification head dense -> tanh -> out_proj on the <s> token.
2 layers, hidden 64, 4 heads, intermediate 128.
id2label {0: CONTRADICTION, 1: NEUTRAL, 2: ENTAILMENT}, as roberta-large-mnli has it.""",
    "nli-bart-bpe-tiny": """BartForSequenceClassification, as transformers' modeling_bart.py builds it:
encoder-decoder with one shared embedding, learned positions with fairseq's offset 2
(max_position_embeddings 1024), scale_embedding false, layernorm_embedding, post-LayerNorm layers,
GELU. The decoder reads input_ids shifted right behind decoder_start_token_id 2 (shift_tokens_right,
computed inside the graph); its self-attention is causal only, its cross-attention masked by
attention_mask. Head dense -> tanh -> out_proj on the hidden state of the LAST </s> of each row,
read as HF does (h[input_ids == 2].view(batch, -1, d)[:, -1]): rows in one batch must hold the same
number of </s> tokens, as in HF (which raises) and its ONNX exports (which do not check).
2 encoder and 2 decoder layers, d_model 64, 4 heads, ffn 128.
id2label {0: contradiction, 1: neutral, 2: entailment}, as bart-large-mnli has it.""",
}


def write_source(out, name, c, params, winners, pairs):
    files = []
    for root, _, names in os.walk(out):
        for n in names:
            rel = os.path.relpath(os.path.join(root, n), out)
            if rel != "SOURCE.txt":
                files.append(rel)
    lines = []
    for rel in sorted(files):
        data = open(os.path.join(out, rel), "rb").read()
        lines.append("%s  %10d  %s" % (hashlib.sha256(data).hexdigest(), len(data), rel))
    text = """%(name)s  --  tiny model with RANDOM weights, made here for tests; its scores are meaningless
%(rule)s
The weights are RANDOM (torch.manual_seed(%(seed)d); linear weights N(0, %(std)s), embeddings
N(0, %(estd)s), out_proj weights N(0, %(hstd)s), its bias then set so the mean logit of each class
over the reference pairs is 0, so every class wins for some inputs: argmax counts %(winners)s
over the %(rows)d pairs). No weights from any hub were used. It exists to run the scorer's code paths
for this architecture (graph inputs, head, labels, byte-level BPE tokenizer) against references.

Architecture (%(params)d parameters)
%(about)s

Graph: onnx/model.onnx, torch %(torch)s torch.onnx.export, opset %(opset)d, dynamic axes batch and
sequence. inputs input_ids int64 [batch, sequence], attention_mask int64 [batch, sequence]
(right padding with pad id 1); output logits float32 [batch, 3].

Tokenizer: byte-level BPE learnt from the transcript corpus by tools/tiny-models/train_bpe.py
(vocabulary %(vocab)d with <s>=0 <pad>=1 </s>=2 <unk>=3 and <mask> last; GPT-2 byte alphabet and
pre-tokenization; RobertaProcessing: <s> A </s></s> B </s>). The same tokenizer.json is in both
tiny model folders.

torch-logits.json: the reference. %(n)d real transcript sentences (every 2003rd sentence of the
corpus, at most 600 characters, plus two with accents, CJK, an emoji, and literal </s> and <mask>)
x the 3 default hypotheses, encoded with %(tok)s (npm, HF's own library) as PAIR_ENCODING=pair
and joined (separator %(sep)s), and the logits of the torch module the graph was exported from,
each pair run alone. make_models.py checks a right-padded batch gives the same logits, and
check_onnx.mjs that ONNX Runtime (onnxruntime-node) gives them within 1e-4, every argmax equal.

Made by (from the repository root; `make tiny-models` runs the same):
  /usr/bin/python3 tools/tiny-models/train_bpe.py ../shared/data/transcripts/transcripts.jsonl \
      roberta=testdata/models/nli-roberta-bpe-tiny bart=testdata/models/nli-bart-bpe-tiny
  HF_TOKENIZERS=<npm tokenizers@0.23.2> node tools/tiny-models/encode_pairs.mjs \
      testdata/models/nli-roberta-bpe-tiny/tokenizer.json ../shared/data/transcripts/transcripts.jsonl > pairs.json
  /usr/bin/python3 tools/tiny-models/make_models.py pairs.json testdata/models
  ORT_NODE=<npm onnxruntime-node@1.30.0> node tools/tiny-models/check_onnx.mjs testdata/models/%(name)s
config.json has the keys transformers' save_pretrained writes for this architecture (sorted, indent 2),
except transformers_version: transformers was not used.

Files (sha256, bytes; SOURCE.txt itself is not listed)
%(files)s
""" % {
        "name": name,
        "rule": "=" * (len(name) + 86),
        "seed": SEED,
        "std": INIT_STD,
        "estd": EMBED_STD,
        "hstd": HEAD_STD,
        "winners": winners,
        "rows": sum(winners),
        "params": params,
        "about": ABOUT[name],
        "torch": torch.__version__,
        "opset": OPSET,
        "vocab": c["vocab_size"],
        "n": len(pairs["sentences"]),
        "tok": pairs["tokenizers"],
        "sep": pairs["pair_separator"],
        "files": "\n".join(lines),
    }
    with open(os.path.join(out, "SOURCE.txt"), "w", encoding="utf-8") as f:
        f.write(text)


if __name__ == "__main__":
    main()
