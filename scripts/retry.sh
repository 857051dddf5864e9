#!/usr/bin/env bash
# Runs a command up to N times with a growing pause between tries, for the
# installs `make test` does on a fresh machine (package mirrors and module
# proxies fail transiently; CI must not).
#
#   scripts/retry.sh N command [args...]
set -uo pipefail
n=${1:?attempts}
shift
for ((i = 1; ; i++)); do
	"$@" && exit 0
	rc=$?
	if ((i >= n)); then
		echo "retry: '$*' failed $n times (last exit $rc)" >&2
		exit "$rc"
	fi
	echo "retry: '$*' failed (exit $rc), attempt $i of $n; retrying in $((i * 5)) s" >&2
	sleep $((i * 5))
done
