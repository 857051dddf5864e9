#!/usr/bin/env bash
# `make run`: the scorer on its in-memory broker (KAFKA_BROKERS=embedded, asked
# for explicitly: `scorer run` refuses an empty KAFKA_BROKERS), fed sample
# transcripts from ../shared, printing a summary once they are scored, then
# serving until Ctrl-C.
set -euo pipefail
cd "$(dirname "$0")/.."
: "${TRANSCRIPTS:=../shared/data/transcripts/transcripts.jsonl}"
: "${DEMO_LIMIT:=20}"
exec bin/scorer run --kafka-brokers embedded --demo-file "$TRANSCRIPTS" --demo-limit "$DEMO_LIMIT" "$@"
