#!/usr/bin/env bash
# The GPU proof in one command (docs/gpu.md, "make gpu-proof"): on a GPU host, with the bundle unpacked,
# in the CUDA image, or in a checkout after `make build cuda-ort`, it writes OUT/gpu-proof.json and
# OUT/gpu-proof.md from these phases (default: all, in this order; each one's files land in OUT):
#   doctor   `scorer doctor --json` with DEVICE=cuda: without a working GPU the proof stops HERE, at once,
#            with the doctor's cause (exit 1)
#   models   the production-size DeBERTa (make_deberta.py --size large --vocab 128100 with the host's
#            torch, unless --model-dir gives a user's export) and its fp16 twin (onnx-fp16: float16
#            logits, as Optimum's --dtype fp16 export), unless the folder already has onnx/model_fp16.onnx
#   parity   `scorer compare` on real transcripts: CPU vs CUDA (fp32, TF32 off and on; the small model
#            and the large one), fp32 vs fp16 on CUDA
#   bench    `scorer gpu-proof bench` for fp32, fp32 with TF32, fp16: pairs/s and memory per shape, the
#            calibrated memory model against the measured peaks, the memory beside the arena
#   share    two `scorer gpu-proof share` at GPU_MEM_LIMIT=0.45 each on one GPU, at the same time
#   report   `scorer gpu-proof report`: the findings, JSON and Markdown
# Options (all optional):
#   --scorer PATH       the scorer to run (default: bin/scorer of this checkout or bundle)
#   --onnx-fp16 PATH    the fp16 converter (default bin/onnx-fp16)
#   --small-model DIR   a small model for the first parity check (default MODEL_DIR, else
#                       ../shared/models/nli-unigram-small)
#   --model-dir DIR     a production-size model folder to use instead of generating one
#   --make-deberta PY   make_deberta.py (default ../shared/tools/large-model/make_deberta.py)
#   --python PY         the Python with torch for make_deberta.py (default python3)
#   --transcripts FILE  real transcripts (default ../shared/data/transcripts/transcripts.jsonl)
#   --work DIR          where models are made (default /tmp/gpu-proof)
#   --out DIR           results (default $OUT if set, else gpu-proof-out)
#   --phases LIST       comma-separated subset of the phases above
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
scorer=${SCORER:-}
fp16tool=""
small=${MODEL_DIR:-}
large=""
make_deberta=""
python=python3
transcripts=""
work=/tmp/gpu-proof
out=${OUT:-gpu-proof-out}
phases=doctor,models,parity,bench,share,report
while (($#)); do
	case $1 in
	--scorer) scorer=$2 ;;
	--onnx-fp16) fp16tool=$2 ;;
	--small-model) small=$2 ;;
	--model-dir) large=$2 ;;
	--make-deberta) make_deberta=$2 ;;
	--python) python=$2 ;;
	--transcripts) transcripts=$2 ;;
	--work) work=$2 ;;
	--out) out=$2 ;;
	--phases) phases=$2 ;;
	-h | --help)
		sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
		exit 0
		;;
	*)
		echo "gpu-proof: unknown argument $1 (see --help)" >&2
		exit 2
		;;
	esac
	shift 2
done
shared=$(cd "$here/.." && pwd)/shared
scorer=${scorer:-$here/bin/scorer}
fp16tool=${fp16tool:-$here/bin/onnx-fp16}
small=${small:-$shared/models/nli-unigram-small}
make_deberta=${make_deberta:-$shared/tools/large-model/make_deberta.py}
transcripts=${transcripts:-$shared/data/transcripts/transcripts.jsonl}
large=${large:-$work/deberta-large}
mkdir -p "$out" "$work"
out=$(cd "$out" && pwd)
has() { [[ ,$phases, == *,$1,* ]]; }
say() { echo "gpu-proof: $*" >&2; }
# The GPU path with the CUDA set of this checkout or bundle; DEVICE and the rest are set per phase.
export CUDA_DEVICE_ORDER=${CUDA_DEVICE_ORDER:-PCI_BUS_ID} LOG_LEVEL=${LOG_LEVEL:-warn}

if has doctor; then
	say "doctor (DEVICE=cuda, MODEL_DIR=$small)"
	rc=0
	DEVICE=cuda MODEL_DIR=$small "$scorer" doctor --json --duration 2s >"$out/doctor.json" 2>"$out/doctor.log" || rc=$?
	verdict=$(sed -n 's/^  "verdict": "\(.*\)",\{0,1\}$/\1/p' "$out/doctor.json" | head -1)
	if ((rc != 0)); then
		remedy=$(sed -n 's/^    "remedy": "\(.*\)",\{0,1\}$/\1/p' "$out/doctor.json" | tail -1)
		say "stopped: no GPU path here. ${verdict:-the doctor failed (exit $rc): $(tail -3 "$out/doctor.log")}"
		[[ -n $remedy ]] && say "remedy: $remedy"
		say "the doctor's report: $out/doctor.json"
		exit 1
	fi
	say "$verdict"
fi

if has models; then
	if [[ ! -f $large/model.onnx ]]; then
		say "making the production-size DeBERTa in $large (make_deberta.py --size large --vocab 128100, ~1 min)"
		"$python" "$here/tools/gpu-proof/make_model.py" "$make_deberta" "$small" "$large" --size large --vocab 128100 >"$out/make-model.log" 2>&1 ||
			{ say "make_deberta.py failed:"; tail -20 "$out/make-model.log" >&2; exit 1; }
	fi
	if [[ ! -f $large/onnx/model_fp16.onnx ]]; then
		mkdir -p "$large/onnx"
		"$fp16tool" "$large/model.onnx" "$large/onnx/model_fp16.onnx" | tee "$out/onnx-fp16.log" >&2
	fi
fi

# cmp NAME ARGS...: one `scorer compare` run into compare-NAME.json (exit 1 = below the gate: kept).
cmp() {
	local name=$1
	shift
	say "parity $name"
	"$scorer" compare --in "$transcripts" --json --min-agreement 0.99 "$@" >"$out/compare-$name.json" 2>"$out/compare-$name.log" || true
}
if has parity; then
	MODEL_DIR=$small GPU_TF32=false cmp small-cpu-vs-cuda-fp32 --limit 20 --a-device cpu --b-device cuda
	MODEL_DIR=$large GPU_TF32=false cmp cpu-vs-cuda-fp32 --limit 3 --a-device cpu --b-device cuda --a-file model.onnx --b-file model.onnx
	MODEL_DIR=$large GPU_TF32=true cmp cpu-vs-cuda-fp32-tf32 --limit 3 --a-device cpu --b-device cuda --a-file model.onnx --b-file model.onnx
	MODEL_DIR=$large GPU_TF32=false cmp cuda-fp32-vs-fp16 --limit 40 --a-device cuda --b-device cuda --a-file model.onnx --b-file onnx/model_fp16.onnx
fi

if has bench; then
	for v in "fp32 false model.onnx" "fp32-tf32 true model.onnx" "fp16 false onnx/model_fp16.onnx"; do
		read -r name tf32 file <<<"$v"
		say "bench $name"
		DEVICE=cuda MODEL_DIR=$large MODEL_FILE=$file GPU_TF32=$tf32 MAX_BATCH_TOKENS=65536 \
			"$scorer" gpu-proof bench --time 1s --out "$out/bench-$name.json" 2>"$out/bench-$name.log" ||
			{ say "bench $name failed:"; tail -5 "$out/bench-$name.log" >&2; }
	done
fi

if has share; then
	say "share: two scorers, GPU_MEM_LIMIT=0.45 each, on one GPU"
	pids=()
	for n in a b; do
		DEVICE=cuda MODEL_DIR=$large MODEL_FILE=onnx/model_fp16.onnx GPU_MEM_LIMIT=0.45 MAX_BATCH_TOKENS=65536 \
			"$scorer" gpu-proof share --name "$n" --in "$transcripts" --limit 60 --out "$out/share-$n.json" 2>"$out/share-$n.log" &
		pids+=($!)
	done
	for p in "${pids[@]}"; do wait "$p" || say "a sharing scorer failed (see $out/share-*.log)"; done
fi

if has report; then
	"$scorer" gpu-proof report --dir "$out"
fi
