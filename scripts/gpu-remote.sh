#!/usr/bin/env bash
# `make gpu-proof` on a remote GPU host reached through a runner that copies the working tree and runs
# one command (../shared/tools/gpu-run/README.md: at most 64 MiB carried per call, 10 minutes per
# command, 8 files of 16 MiB back from $OUT, /tmp kept only while the host stays up between calls).
# docs/gpu.md lists the calls in order. Steps:
#   prepare        here: make dist, bin/onnx-fp16, and .gpu/ with the parts to carry (each < 55 MiB)
#   stage          there: copy the carried .gpu/* into /tmp/stage (one call per part)
#   run PHASES     there: unpack once, run scripts/gpu-proof.sh --phases PHASES, pack the results into $OUT
# GPU_PYTHON (default /opt/torch/.venv/bin/python3, else python3) is the host's Python with torch and
# NVIDIA's CUDA 13 wheels: it makes the production-size model and the launcher takes the CUDA libraries
# from its site-packages.
set -euo pipefail
cd "$(dirname "$0")/.."
stage=/tmp/stage s=/tmp/s res=/tmp/gpu-proof-out

case ${1:-} in
prepare)
	make build cuda-ort dist VERSION=gpu
	go build -o bin/onnx-fp16 ./tools/onnx-fp16
	grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo /.gpu/ >>"$(git rev-parse --git-path info/exclude)"
	rm -rf .gpu && mkdir -p .gpu/m1 .gpu/large-model
	src=../shared/models/nli-unigram-small
	cp "$src"/{model.onnx,config.json,tokenizer.json,tokenizer_config.json,special_tokens_map.json} .gpu/m1/
	cp ../shared/tools/large-model/*.py .gpu/large-model/
	head -n 200 ../shared/data/transcripts/transcripts.jsonl >.gpu/transcripts.jsonl
	tar -cf - dist/scorer-gpu-linux-amd64-cuda.tar.zst bin/onnx-fp16 | split -b 50m - .gpu/part-
	ls -l .gpu .gpu/m1
	;;
stage)
	mkdir -p "$stage" && cp -r .gpu/* "$stage/" && ls -l "$stage"
	;;
run)
	phases=${2:?phases, e.g. doctor,models,parity}
	cp -r .gpu/* "$stage/" 2>/dev/null || true
	if [[ ! -x $s/bin/onnx-fp16 ]]; then
		mkdir -p "$s" && cat "$stage"/part-* | tar -x -C "$s"
		tar --zstd -xf "$s"/dist/scorer-gpu-linux-amd64-cuda.tar.zst -C "$s"
	fi
	py=${GPU_PYTHON:-/opt/torch/.venv/bin/python3}
	[[ -x $py ]] || py=python3
	export SCORER_PYTHON=$py
	rc=0
	scripts/gpu-proof.sh --scorer "$s/scorer-gpu-linux-amd64-cuda/bin/scorer" --onnx-fp16 "$s/bin/onnx-fp16" \
		--small-model "$stage/m1" --make-deberta "$stage/large-model/make_deberta.py" --python "$py" \
		--transcripts "$stage/transcripts.jsonl" --work /tmp/gpu-proof --out "$res" --phases "$phases" || rc=$?
	if [[ -n ${OUT:-} ]]; then
		tar -czf "$OUT/gpu-proof-results.tgz" -C "$res" .
		cp "$res"/gpu-proof.md "$res"/gpu-proof.json "$OUT/" 2>/dev/null || true
		nvidia-smi >"$OUT/nvidia-smi.txt" 2>&1 || true
	fi
	exit $rc
	;;
*)
	sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
	exit 2
	;;
esac
