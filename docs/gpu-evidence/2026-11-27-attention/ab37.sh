#!/usr/bin/env bash
# Issue 37's A/B on one GPU: ATTENTION_REWRITES=align,scale,mask (the new default) against none (the
# relative-attention rewrite alone, the previous default), alternated, fp16 end to end on the 30 real
# transcripts and on ~500-token premises; the shape bench at 48/128/512 tokens for both; scorer compare
# on CUDA fp16, every rewrite against the graph as exported; then an Nsight Compute window past the
# pool's calibration with the new default. Derived from ../shared/tools/gpu-run/rewrite.sh and ncu.sh.
set -u
P=$(cd "$(dirname "$0")" && pwd)
G=$P
start=$(date +%s)
BUDGET=${BUDGET:-470}
R=/tmp/res
rm -rf "$R" /tmp/s /tmp/m /tmp/tok /tmp/lm /tmp/data && mkdir -p "$R" /tmp/s /tmp/m /tmp/tok
exec > >(tee "$OUT/log.txt") 2>&1
left() { echo $((start + BUDGET - $(date +%s))); }
say() { echo "[$(($(date +%s) - start))s] $*"; }
snap() { tar -czf "$OUT/res.tgz" -C /tmp res 2>/dev/null; }
unxz_to() { if command -v xz >/dev/null; then xz -dc "$1" | tar -x -C "$2"; else
	"$PY" -c 'import lzma,shutil,sys; shutil.copyfileobj(lzma.open(sys.argv[1]), sys.stdout.buffer)' "$1" | tar -x -C "$2"; fi; }
if [[ -z ${PY:-} ]]; then PY=python3; [[ -x /opt/torch/.venv/bin/python3 ]] && PY=/opt/torch/.venv/bin/python3; fi
PROV=$G/provA.tar.xz
[[ -f $PROV ]] || PROV=/tmp/stage/provA.tar.xz
[[ -f $PROV ]] || { echo "no provA.tar.xz: run the stage call first"; exit 1; }
say "host: $(nproc) cores; python $PY; budget ${BUDGET}s"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | tee "$R/gpu.txt"
unxz_to "$PROV" /tmp/s
unxz_to "$G/restB.tar.xz" /tmp/s
unxz_to "$G/tok.tar.xz" /tmp/tok
unxz_to "$G/tools.tar.xz" /tmp
unxz_to "$G/data.tar.xz" /tmp
T30=/tmp/data/t30.jsonl
B=/tmp/s/scorer-gpu-linux-amd64-cuda
SC=$B/bin/scorer
(cd "$B" && sha256sum -c SHA256SUMS) >"$R/sha256.txt" 2>&1 && say "bundle unpacked, sums ok" || say "bundle sums FAILED"
export SCORER_PYTHON=$PY LOG_LEVEL=info CUDA_DEVICE_ORDER=PCI_BUS_ID
head -n 10 "$T30" >/tmp/t10.jsonl
"$PY" - "$T30" /tmp/long.jsonl <<'PY'
import json, sys
evs = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
sents = [s for e in evs for v in e['sections'].values() for s in v]
longs, i = [], 0
while len(longs) < 300:
    buf = []
    while len(' '.join(buf).split()) < 390: buf.append(sents[i % len(sents)]); i += 1
    longs.append(' '.join(buf))
open(sys.argv[2], 'w').write(''.join(json.dumps({'call_id': f'LONG-{k}', 'sections': {'FILT_MD': longs[k*50:(k+1)*50]}}) + '\n' for k in range(6)))
PY
say "making the model"
OMP_NUM_THREADS=14 "$PY" "$P/make_model.py" /tmp/lm/make_deberta.py /tmp/tok /tmp/m/large --size large --vocab 128100 >"$R/make-large.log" 2>&1 &&
	mkdir -p /tmp/m/large/onnx && /tmp/onnx-fp16 /tmp/m/large/model.onnx /tmp/m/large/onnx/model_fp16.onnx >"$R/onnx-fp16.log" 2>&1 ||
	{ say "model FAILED"; tail -n 5 "$R/make-large.log" "$R/onnx-fp16.log"; }
say "model made"
L=/tmp/m/large
F16=MODEL_FILE=onnx/model_fp16.onnx
score() { # NAME IN NEED ENV...
	local name=$1 in=$2 need=$3; shift 3
	(($(left) < need)) && { say "skip score $name (left $(left)s)"; return; }
	local t0 t1 rc fin pairs ms
	t0=$(date +%s.%N)
	env DEVICE=cuda MODEL_DIR=$L SCORE_CACHE_BYTES=0 "$@" timeout 150 "$SC" score --in "$in" --out "/tmp/o-$name.jsonl" --progress off >"$R/score-$name.log" 2>&1
	rc=$?; t1=$(date +%s.%N)
	fin=$(grep -m1 '"score finished"' "$R/score-$name.log" | sed 's/.*"pairs":\([0-9]*\).*"elapsed":\([0-9.]*\).*/\1 \2/')
	read -r pairs ms <<<"${fin:-0 0}"
	echo "$name rc=$rc pairs=$pairs scoring_ms=$ms $(awk -v a="$t0" -v b="$t1" -v p="$pairs" -v ms="$ms" 'BEGIN{printf "wall_s=%.1f pairs_per_s=%.1f", b-a, p*1000/(ms+0.001)}') env=$*" | tee -a "$R/score-summary.txt"
	grep -m1 -i 'graph_rewrite' "$R/score-$name.log" | cut -c1-400 >>"$R/rewrite-lines.txt"
	snap
}
NONE=ATTENTION_REWRITES=none
score fp16-new-1 "$T30" 30 $F16
score fp16-none-1 "$T30" 30 $F16 $NONE
score fp16-new-2 "$T30" 30 $F16
score fp16-none-2 "$T30" 30 $F16 $NONE
score long-fp16-new /tmp/long.jsonl 40 $F16
score long-fp16-none /tmp/long.jsonl 40 $F16 $NONE
bench() { # NAME NEED ENV...
	local name=$1 need=$2; shift 2
	(($(left) < need)) && { say "skip bench $name (left $(left)s)"; return; }
	say "bench $name"
	env DEVICE=cuda MODEL_DIR=$L MAX_BATCH_TOKENS=65536 "$@" timeout 90 "$SC" gpu-proof bench --time 1s --lengths 48,128,512 --tokens 16384,65536 --out "$R/bench-$name.json" >"$R/bench-$name.log" 2>&1
	say "bench $name rc=$?"; snap
}
bench fp16-new 40 $F16
bench fp16-none 40 $F16 $NONE
if (($(left) >= 40)); then
	say "compare cuda fp16: every rewrite vs the graph as exported"
	MODEL_DIR=$L timeout 120 "$SC" compare --json --min-agreement 0.99 --in /tmp/t10.jsonl --limit 5 --a-device cuda --b-device cuda \
		--a-file onnx/model_fp16.onnx --b-file onnx/model_fp16.onnx --a-rel-attention-rewrite true --b-rel-attention-rewrite false >"$R/compare-fp16-new-vs-exported.json" 2>"$R/compare.log"
	say "compare rc=$? $(grep -m3 -o '"max_abs_diff":[^,]*\|"agreement":[^,]*' "$R/compare-fp16-new-vs-exported.json" | tr '\n' ' ')"; snap
fi
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -n 1)
if [[ -n $NCU ]] && (($(left) >= 60)); then
	head -n 3 "$T30" >/tmp/short.jsonl
	say "ncu short-steady (new default)"
	LOG_LEVEL=warn DEVICE=cuda MODEL_DIR=$L MODEL_FILE=onnx/model_fp16.onnx SCORE_CACHE_BYTES=0 timeout $(( $(left) - 10 )) \
		"$NCU" --clock-control none --target-processes all --metrics gpu__time_duration.sum --csv --print-units base \
		--launch-skip 25000 --launch-count 1500 "$SC" score --in /tmp/short.jsonl --out /tmp/o.jsonl --progress off >"$R/ncu-short-steady.csv" 2>"$R/ncu.err"
	say "ncu rc=$? $(grep -c gpu__time_duration "$R/ncu-short-steady.csv") kernels"
	"$PY" "$P/ncu_sum.py" "$R/ncu-short-steady.csv" >"$OUT/ncu-short-steady.txt" 2>&1; head -n 30 "$OUT/ncu-short-steady.txt"
fi
cp "$R/score-summary.txt" "$R/rewrite-lines.txt" "$OUT/" 2>/dev/null
snap
say "done, left $(left)s"
