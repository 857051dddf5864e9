#!/usr/bin/env bash
# Builds the production-size DeBERTa-v3 stand-in `make bench` measures:
#
#   scripts/make-deberta.sh SHARED_DIR OUT_DIR
#
# ../shared/tools/large-model/make_deberta.py writes the production model's
# architecture (DebertaV2ForSequenceClassification, deberta-v3-large's
# shape, the real 128,100-row embedding: 435M parameters, 1.74 GB) with
# random weights and the real DeBERTa-v3 tokenizer of nli-deberta-v3-tiny,
# plus its dynamic int8 graph (onnx/model_quantized.onnx). About a minute and
# 8.5 GB of memory on 2 cores. Needs Debian's python3-torch and python3-onnx
# (installed here with apt when root). OUT_DIR appears only when complete.
# Never commit it.
set -euo pipefail

shared=${1:?shared directory}
out=${2:?output directory}
here=$(cd "$(dirname "$0")" && pwd)
py=/usr/bin/python3

if ! "$py" -c 'import torch, onnx' 2>/dev/null; then
	if [[ $(id -u) != 0 ]]; then
		echo "make-deberta: $py lacks torch/onnx; install Debian's python3-torch python3-onnx libopenblas0-pthread" >&2
		exit 1
	fi
	"$here/retry.sh" 3 bash -c 'apt-get update -qq -o Acquire::Retries=3 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq -o Acquire::Retries=3 python3-torch python3-onnx libopenblas0-pthread >/dev/null'
fi
rm -rf "$out.tmp"
"$py" "$shared/tools/large-model/make_deberta.py" "$shared/models/nli-deberta-v3-tiny" "$out.tmp" --size large --vocab 128100 --int8
rm -rf "$out"
mv "$out.tmp" "$out"
