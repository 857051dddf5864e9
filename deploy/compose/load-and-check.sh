#!/usr/bin/env bash
# Loads sample transcripts into the compose stack with `scorer produce` and polls Postgres until the
# JDBC sink has written rows, printing counts as they grow.
#
# Usage (from anywhere, after `docker compose up -d` in deploy/compose):
#   deploy/compose/load-and-check.sh [LIMIT]          # default LIMIT=20 transcripts
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
LIMIT=${1:-${LIMIT:-20}}
TIMEOUT_S=${TIMEOUT_S:-600}
FILE=${FILE:-/data/transcripts.jsonl}
TABLE=score_rows

compose() { docker compose -f "$here/compose.yaml" "$@"; }

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
