#!/usr/bin/env bash
# Issue 46's GPU A/B in one call: each setting alternated with the baseline
# (the defaults) in the same process tree on the same GPU, so drift between
# calls (clocks, neighbours, a different machine) cannot pass for a gain.
#
#   scripts/gpu-ab.sh --scorer BIN --model DIR --in T30.jsonl --out DIR [flags]
#
# Per round, `scorer score` end to end on --in (and on --long, ~500-token
# premises, when given) for the baseline and then every variant; the next
# round takes the variants in reverse order. Then the shape bench
# (`gpu-proof bench`) per variant, `scorer compare` on $DEVICE (the rewrites
# against the graph as exported) per compare variant, and an Nsight Compute
# window of real batches (the calibration cached by the runs before it, so
# the window is not the pool's start-up). Everything lands in --out: log.txt,
# commands.txt (every command, shell-quoted), summary.tsv (one line per
# score run: pairs/s and how busy the GPU was), and each step's logs/JSON.
#
# Flags:
#   --variants a,b   which variants (default: all of the list below)
#   --rounds N       rounds of baseline + variants (default 2)
#   --long FILE      also score this input (the ~500-token premises)
#   --compare a,b    variants compared against the exported graph (default base,pad8,mha)
#   --budget S       seconds for the whole run; a step that would not fit is
#                    skipped and says so (default 540)
#   --dry-run        print every command, run nothing
# Environment: DEVICE (default cuda), MODEL_FILE (default onnx/model_fp16.onnx
# on cuda), NCU (the ncu binary; default: found on PATH or under
# /opt/nvidia), NCU_SKIP/NCU_COUNT (the window, default 2000/1500 launches),
# BENCH_LENGTHS/BENCH_TOKENS/BENCH_TIME (the shape bench).
# On DEVICE=cpu the bench and ncu steps are skipped (they need a GPU): the
# rest runs, which is how the script is tested without one.
set -uo pipefail

# name=space-separated KEY=VALUE settings over the defaults. PAD_TO_MULTIPLE_OF
# and the rewrites are issue 46's items 1 and 2; MAX_BATCH_ROWS/TOKENS item 4.
VARIANT_LIST=(
	"pad1=PAD_TO_MULTIPLE_OF=1"
	"pad8=PAD_TO_MULTIPLE_OF=8"
	"mha=ATTENTION_REWRITES=align,scale,mask,skipln,mha"
	"nomha=ATTENTION_REWRITES=align,scale,mask,skipln"
	"mha-pad8=ATTENTION_REWRITES=align,scale,mask,skipln,mha PAD_TO_MULTIPLE_OF=8"
	"rows512=MAX_BATCH_ROWS=512 MAX_BATCH_TOKENS=32768"
	"rows1024=MAX_BATCH_ROWS=1024 MAX_BATCH_TOKENS=65536"
	"rows256-tok32k=MAX_BATCH_ROWS=256 MAX_BATCH_TOKENS=32768"
	"rows1024-tok16k=MAX_BATCH_ROWS=1024 MAX_BATCH_TOKENS=16384"
)

usage() {
	sed -n '2,/^set -uo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//' >&2
	exit 2
}

SCORER= MODEL= IN= LONG= OUT= ROUNDS=2 ONLY= COMPARE=base,pad8,mha BUDGET=540 DRY=0
while (($#)); do
	case $1 in
	--scorer) SCORER=${2:?}; shift ;;
	--model) MODEL=${2:?}; shift ;;
	--in) IN=${2:?}; shift ;;
	--long) LONG=${2:?}; shift ;;
	--out) OUT=${2:?}; shift ;;
	--rounds) ROUNDS=${2:?}; shift ;;
	--variants) ONLY=${2:?}; shift ;;
	--compare) COMPARE=${2?}; shift ;;
	--budget) BUDGET=${2:?}; shift ;;
	--dry-run) DRY=1 ;;
	-h | --help) usage ;;
	*) echo "gpu-ab: unknown argument: $1" >&2; usage ;;
	esac
	shift
done
[[ -n $SCORER && -n $MODEL && -n $IN && -n $OUT ]] || { echo "gpu-ab: --scorer, --model, --in and --out are required" >&2; usage; }
[[ $ROUNDS =~ ^[1-9][0-9]*$ && $BUDGET =~ ^[0-9]+$ ]] || { echo "gpu-ab: --rounds and --budget take whole numbers" >&2; exit 2; }

DEVICE=${DEVICE:-cuda}
if [[ -z ${MODEL_FILE+set} && $DEVICE == cuda ]]; then
	MODEL_FILE=onnx/model_fp16.onnx
fi
MODEL_FILE=${MODEL_FILE:-model.onnx}
BENCH_LENGTHS=${BENCH_LENGTHS:-48,128,512}
BENCH_TOKENS=${BENCH_TOKENS:-16384,65536}
BENCH_TIME=${BENCH_TIME:-1s}
NCU_SKIP=${NCU_SKIP:-2000}
NCU_COUNT=${NCU_COUNT:-1500}

# The chosen variants: name -> settings (one word each, never split again).
declare -A SETTINGS=([base]="")
NAMES=()
for v in "${VARIANT_LIST[@]}"; do
	name=${v%%=*}
	if [[ -z $ONLY || ,$ONLY, == *,"$name",* ]]; then
		SETTINGS[$name]=${v#*=}
		NAMES+=("$name")
	fi
done
for want in ${ONLY//,/ } ${COMPARE//,/ }; do
	[[ -n ${SETTINGS[$want]+set} ]] || { echo "gpu-ab: unknown variant $want (known: base ${VARIANT_LIST[*]%%=*})" >&2; exit 2; }
done

mkdir -p "$OUT" || exit 1
OUT=$(cd "$OUT" && pwd)
: >"$OUT/commands.txt"
if ((!DRY)); then
	exec > >(tee "$OUT/log.txt") 2>&1
	printf 'name\tinput\tround\trc\tpairs\telapsed_ms\tpairs_per_s\tgpu_busy\tsettings\n' >"$OUT/summary.tsv"
fi
start=$(date +%s)
left() { echo $((start + BUDGET - $(date +%s))); }
say() { echo "[$(($(date +%s) - start))s] $*"; }

# run LOG TIMEOUT ENV... -- CMD ARGS...: runs CMD under env with the given
# settings, stdout and stderr to LOG (stdout to $STDOUT_TO when set);
# records the command shell-quoted. Each setting reaches env as one
# argument, so none can become the command (ab37b.sh's bug: an unquoted
# $MHA before `timeout` ran ATTENTION_REWRITES=... as the program).
run() {
	local log=$1 limit=$2; shift 2
	local -a envs=()
	while [[ $1 != -- ]]; do envs+=("$1"); shift; done
	shift
	local line out=${STDOUT_TO:-$log}
	line=$(printf '%q ' env "${envs[@]}" timeout "$limit" "$@")
	if [[ $out == "$log" ]]; then
		echo "${line% } >$(printf '%q' "$log") 2>&1" >>"$OUT/commands.txt"
	else
		echo "${line% } >$(printf '%q' "$out") 2>$(printf '%q' "$log")" >>"$OUT/commands.txt"
	fi
	if ((DRY)); then
		echo "${line% }"
		return 0
	fi
	env "${envs[@]}" timeout "$limit" "$@" >"$out" 2>"$log"
}

# settings NAME: the variant's KEY=VALUE words, one per line.
settings() { tr ' ' '\n' <<<"${SETTINGS[$1]}" | sed '/^$/d'; }

# The baseline settings every run shares: the model, no score cache (it
# would answer repeats without the GPU), the GPU calibration cached in OUT
# (the first run measures, the rest and the ncu window reuse it).
COMMON=(DEVICE="$DEVICE" MODEL_DIR="$MODEL" MODEL_FILE="$MODEL_FILE" SCORE_CACHE_BYTES=0 LOG_FORMAT=json LOG_LEVEL=info
	GPU_CALIBRATION_CACHE="$OUT/gpu-calibration" CUDA_DEVICE_ORDER=PCI_BUS_ID)

# score NAME INPUT_TAG INPUT ROUND
score() {
	local name=$1 tag=$2 in=$3 round=$4 need=40
	local log="$OUT/score-$tag-$name-r$round.log"
	if ((!DRY && $(left) < need)); then say "skip score $tag $name r$round (left $(left)s)"; return; fi
	local -a envs
	mapfile -t envs < <(settings "$name")
	run "$log" 300 "${COMMON[@]}" "${envs[@]}" -- "$SCORER" score --in "$in" --out "$OUT/out-$tag-$name-r$round.jsonl" --progress off
	local rc=$?
	((DRY)) && return
	local fin pairs ms busy
	fin=$(grep -m1 '"score finished"' "$log")
	pairs=$(grep -o '"pairs":[0-9]*' <<<"$fin" | cut -d: -f2)
	ms=$(grep -o '"elapsed":[0-9.]*' <<<"$fin" | cut -d: -f2)
	busy=$(grep -o '"gpu_busy":"[^"]*"' <<<"$fin" | cut -d'"' -f4)
	local pps
	pps=$(awk -v p="${pairs:-0}" -v ms="${ms:-0}" 'BEGIN { if (ms > 0) printf "%.1f", p * 1000 / ms; else print "-" }')
	printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$name" "$tag" "$round" "$rc" "${pairs:--}" "${ms:--}" "$pps" "${busy:-n/a}" "${SETTINGS[$name]:-defaults}" >>"$OUT/summary.tsv"
	say "score $tag $name r$round rc=$rc pairs=${pairs:--} pairs/s=$pps gpu_busy=${busy:-n/a}"
}

if ((!DRY)); then
	say "gpu-ab: DEVICE=$DEVICE model $MODEL ($MODEL_FILE), variants: ${NAMES[*]}, $ROUNDS rounds, budget ${BUDGET}s"
	{
		echo "date: $(date -u +%FT%TZ)"
		echo "scorer: $SCORER sha256 $(sha256sum "$SCORER" 2>/dev/null | cut -d" " -f1)"
		echo "git: $(git -C "$(dirname "$0")" rev-parse HEAD 2>/dev/null || echo unknown)"
		nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader 2>&1 || true
	} >"$OUT/env.txt"
fi

inputs=("t30=$IN")
[[ -n $LONG ]] && inputs+=("long=$LONG")
for ((r = 1; r <= ROUNDS; r++)); do
	order=("${NAMES[@]}")
	if ((r % 2 == 0)); then
		order=()
		for ((i = ${#NAMES[@]} - 1; i >= 0; i--)); do order+=("${NAMES[i]}"); done
	fi
	for input in "${inputs[@]}"; do
		score base "${input%%=*}" "${input#*=}" "$r"
		for name in "${order[@]}"; do
			score "$name" "${input%%=*}" "${input#*=}" "$r"
		done
	done
done

if [[ $DEVICE == cuda ]]; then
	for name in base "${NAMES[@]}"; do
		if ((!DRY && $(left) < 60)); then say "skip bench $name (left $(left)s)"; continue; fi
		mapfile -t envs < <(settings "$name")
		run "$OUT/bench-$name.log" 150 "${COMMON[@]}" MAX_BATCH_TOKENS=65536 "${envs[@]}" -- "$SCORER" gpu-proof bench --time "$BENCH_TIME" \
			--lengths "$BENCH_LENGTHS" --tokens "$BENCH_TOKENS" --out "$OUT/bench-$name.json"
		((DRY)) || say "bench $name rc=$?"
	done
else
	say "shape bench skipped: DEVICE=$DEVICE (gpu-proof bench needs a GPU)"
fi

for name in ${COMPARE//,/ }; do
	if ((!DRY && $(left) < 40)); then say "skip compare $name (left $(left)s)"; continue; fi
	mapfile -t envs < <(settings "$name")
	# Both sides on $DEVICE with the same file: A with the rewrites (and the
	# variant's settings), B the graph as exported.
	STDOUT_TO="$OUT/compare-$name.json" run "$OUT/compare-$name.log" 200 "${COMMON[@]}" "${envs[@]}" -- "$SCORER" compare --json --min-agreement 0.99 --in "$IN" --limit 5 \
		--a-device "$DEVICE" --b-device "$DEVICE" --a-file "$MODEL_FILE" --b-file "$MODEL_FILE" \
		--a-rel-attention-rewrite true --b-rel-attention-rewrite false
	rc=$?
	if ((!DRY)); then
		say "compare $name rc=$rc $(grep -o '"max_abs_diff":[^,]*\|"agreement":[^,]*' "$OUT/compare-$name.json" | head -n 3 | tr '\n' ' ')"
	fi
done

NCU=${NCU:-$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -n 1)}
if [[ $DEVICE != cuda ]]; then
	say "ncu skipped: DEVICE=$DEVICE"
elif [[ -z $NCU ]]; then
	say "ncu skipped: no ncu on this machine"
else
	for name in base mha-pad8; do
		[[ -n ${SETTINGS[$name]+set} ]] || continue
		if ((!DRY && $(left) < 70)); then say "skip ncu $name (left $(left)s)"; continue; fi
		mapfile -t envs < <(settings "$name")
		run "$OUT/ncu-$name.csv" $((DRY ? 300 : $(left) - 10)) "${COMMON[@]}" LOG_LEVEL=warn "${envs[@]}" -- "$NCU" --clock-control none \
			--target-processes all --metrics gpu__time_duration.sum --csv --print-units base \
			--launch-skip "$NCU_SKIP" --launch-count "$NCU_COUNT" "$SCORER" score --in "$IN" --out "$OUT/out-ncu-$name.jsonl" --progress off
		rc=$?
		# The target: no align1 GEMM among the kernels of real batches.
		((DRY)) || say "ncu $name rc=$rc: $(grep -c gpu__time_duration "$OUT/ncu-$name.csv") kernels, $(grep gpu__time_duration "$OUT/ncu-$name.csv" | grep -c align1) align1"
	done
fi
((DRY)) || say "done, left $(left)s; evidence in $OUT"
