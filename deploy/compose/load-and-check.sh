#!/usr/bin/env bash
# Loads sample transcripts into the compose stack with `scorer produce` and polls Postgres until the
# JDBC sink has written rows, printing counts as they grow.
#
# Usage (from anywhere):
#   deploy/compose/load-and-check.sh --up [LIMIT]     # check host dirs, `docker compose up -d --build`, load
#   deploy/compose/load-and-check.sh [LIMIT]          # stack already up; default LIMIT=20 transcripts
#   deploy/compose/load-and-check.sh --check          # only check the host directories, then exit
#
# Before anything else it checks MODEL_HOST_DIR (must exist and hold config.json) and TRANSCRIPTS_DIR
# (must hold transcripts.jsonl), taken from the environment, else from deploy/compose/.env, else
# compose.yaml's defaults. Docker would silently create a missing bind-mount directory, empty, and the
# scorer would restart-loop on the missing model, so check before the first `docker compose up`.
# Environment:
#   LIMIT        transcripts to send (default 20, or $1)
#   TIMEOUT_S    give up after this many seconds (default 600)
#   FILE         input file as seen by the scorer container (default /data/transcripts.jsonl,
#                i.e. $TRANSCRIPTS_DIR/transcripts.jsonl on the host)
#   SCORER_BIN   if set, run this local binary against the outside listener instead of the container
#   BROKERS      brokers for SCORER_BIN (default localhost:9094)
#   PSQL_LOCAL=1 use a local psql against localhost:5432 instead of `docker compose exec postgres psql`
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
cd "$here"
mode=load
case "${1:-}" in
  --up) mode=up; shift ;;
  --check) mode=check; shift ;;
esac
LIMIT=${1:-${LIMIT:-20}}
TIMEOUT_S=${TIMEOUT_S:-600}
FILE=${FILE:-/data/transcripts.jsonl}
TABLE=score_rows

compose() { docker compose -f "$here/compose.yaml" "$@"; }

# host_dir VAR DEFAULT: the value compose will use for ${VAR:-DEFAULT}: the environment, then a
# VAR=... line in .env next to compose.yaml, then the default. Relative paths are relative to this
# directory (the compose project directory), which is the current directory here.
host_dir() {
  local name=$1 def=$2 val=${!1:-}
  if [[ -z "$val" && -f "$here/.env" ]]; then
    val=$(sed -n "s/^[[:space:]]*$name[[:space:]]*=[[:space:]]*//p" "$here/.env" | tail -n 1)
    val=${val%\"}; val=${val#\"}; val=${val%\'}; val=${val#\'}
  fi
  printf '%s' "${val:-$def}"
}

check_host_dirs() {
  local model data bad=0
  model=$(host_dir MODEL_HOST_DIR ../../../shared/models/nli-unigram-small)
  data=$(host_dir TRANSCRIPTS_DIR ../../../shared/data/transcripts)
  if [[ ! -d "$model" ]]; then
    echo "MODEL_HOST_DIR=$model (relative to $here) does not exist." >&2
    echo "  Docker would create it empty and the scorer would restart-loop. Point MODEL_HOST_DIR at a model" >&2
    echo "  directory (config.json, tokenizer.json, model.onnx), e.g. MODEL_HOST_DIR=/abs/path/nli-unigram-small." >&2
    bad=1
  elif [[ ! -f "$model/config.json" ]]; then
    echo "MODEL_HOST_DIR=$model has no config.json: not a model directory (empty? created by an earlier" >&2
    echo "  docker compose up with a wrong path?). Point MODEL_HOST_DIR at the model directory." >&2
    bad=1
  fi
  if [[ -z "${SCORER_BIN:-}" && ! -f "$data/transcripts.jsonl" ]]; then
    echo "TRANSCRIPTS_DIR=$data (relative to $here) has no transcripts.jsonl; set TRANSCRIPTS_DIR." >&2
    bad=1
  fi
  if (( bad )); then
    exit 2
  fi
  echo "== host directories OK: model $model, transcripts $data"
}

check_host_dirs
case "$mode" in
  check) exit 0 ;;
  up)
    echo "== docker compose up -d --build"
    compose up -d --build
    ;;
esac

psql_q() {
  if [[ "${PSQL_LOCAL:-0}" == 1 ]]; then
    PGPASSWORD=scorer psql -h localhost -p 5432 -U scorer -d scores -tAq -c "$1"
  else
    compose exec -T postgres psql -U scorer -d scores -tAq -c "$1"
  fi
}

echo "== producing $LIMIT transcripts to topic 'transcripts'"
if [[ -n "${SCORER_BIN:-}" ]]; then
  "$SCORER_BIN" produce --brokers "${BROKERS:-localhost:9094}" --topic transcripts --file "$FILE" --limit "$LIMIT"
else
  compose run --rm --no-deps scorer produce --brokers kafka:9092 --topic transcripts --file "$FILE" --limit "$LIMIT"
fi

echo "== waiting for rows in Postgres table $TABLE (timeout ${TIMEOUT_S}s)"
deadline=$(( $(date +%s) + TIMEOUT_S ))
last=-1 stable=0
while :; do
  exists=$(psql_q "select to_regclass('public.$TABLE') is not null" 2>/dev/null || echo f)
  if [[ "$exists" == t ]]; then
    rows=$(psql_q "select count(*) from $TABLE")
    calls=$(psql_q "select count(distinct call_id) from $TABLE")
    echo "$(date +%T) rows=$rows calls=$calls"
    if [[ "$rows" -gt 0 && "$rows" == "$last" ]]; then
      stable=$((stable + 1))
    else
      stable=0
    fi
    last=$rows
    # Done when every sent transcript has rows and the count held for one poll, or when the count
    # has not moved for six polls (some inputs may have gone to the DLQ instead).
    if [[ "$rows" -gt 0 ]] && { [[ "$calls" -ge "$LIMIT" && "$stable" -ge 1 ]] || [[ "$stable" -ge 6 ]]; }; then
      echo "== done: $rows rows for $calls of $LIMIT calls"
      if [[ "$calls" -lt "$LIMIT" ]]; then
        echo "note: $(( LIMIT - calls )) transcripts have no rows; check the DLQ topic transcripts.dlq and scorer_dlq_total" >&2
      fi
      psql_q "select label, count(*), round(avg(score)::numeric, 4) from $TABLE group by label order by label" || true
      exit 0
    fi
  else
    echo "$(date +%T) table $TABLE not created yet"
  fi
  if (( $(date +%s) > deadline )); then
    echo "timed out; last row count $last" >&2
    echo "hints: docker compose logs scorer connect; curl -s localhost:8083/connectors/scorer-rows-jdbc-sink/status" >&2
    exit 1
  fi
  sleep 5
done
