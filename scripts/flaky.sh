#!/usr/bin/env bash
# Runs the tests a change touches many times under the race detector, so a
# test that passes by chance is caught before CI catches it once:
#
#   scripts/flaky.sh [BASE]        # default BASE: origin/main if it exists, else HEAD~1
#   COUNT=50 scripts/flaky.sh BASE # runs per test (default 30)
#   LIST=1 scripts/flaky.sh BASE   # print what would run, run nothing
#   DIRS='consumer producer' [RUN='TestA|TestB'] scripts/flaky.sh
#                                  # those packages' tests (default: all), not a change's
#
# "Touched" is every Test function of a _test.go file with a line added or
# changed since BASE (committed or not), found by the hunk's line number in
# the file as it is now. Each package's tests run COUNT times, each run a
# fresh process of its -race test binary (-test.run '^(A|B)$'). Exit
# status 1 on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."
base=${1:-}
if [[ -z $base ]]; then
	base=$(git rev-parse -q --verify origin/main || git rev-parse HEAD~1)
fi
count=${COUNT:-30}

declare -A tests # package dir -> "A|B|…"
for dir in ${DIRS:-}; do
	tests[$dir]=${RUN:-.*}
done
[[ -n ${DIRS:-} ]] || while IFS= read -r file; do
	[[ -f $file ]] || continue
	# New-file line numbers of added or changed lines (@@ -a,b +c,d @@).
	spans=$(git diff -U0 "$base" -- "$file" | sed -n 's/^@@ -[0-9,]* +\([0-9]*\)\(,[0-9]*\)\{0,1\} @@.*/\1\2/p')
	[[ -n $spans ]] || continue
	# A span "c,d" is d lines from c ("c": one line; d = 0, a deletion after
	# line c: that line). A span counts for the Test function it falls in.
	names=$(awk -v spans="$spans" '
		BEGIN {
			n = split(spans, s, "\n")
			for (i = 1; i <= n; i++) { k = split(s[i], p, ","); from[i] = p[1] + 0; len[i] = (k < 2 || p[2] == 0) ? 1 : p[2] + 0 }
		}
		/^func / {
			name = ""
			if ($0 ~ /^func Test[A-Za-z0-9_]*\(t \*testing\.T\)/) { name = $2; sub(/\(.*/, "", name) }
		}
		name != "" { for (i in from) if (NR >= from[i] && NR < from[i] + len[i]) hit[name] = 1 }
		/^}/ { name = "" }
		END { for (h in hit) print h }' "$file")
	dir=$(dirname "$file")
	for n in $names; do
		tests[$dir]="${tests[$dir]:+${tests[$dir]}|}$n"
	done
done < <(git diff --name-only "$base" -- '*_test.go')

if [[ ${#tests[@]} -eq 0 ]]; then
	echo "flaky: no test function changed since $base"
	exit 0
fi
# Each run is a fresh process of one -race test binary, not one process
# with -test.count: state a test leaves behind (goroutines, brokers, the
# race detector's shadow memory) then cannot carry into the next run, and a
# process of 30 runs of the consumer package grew past 11 GB. A failure
# stops that package's runs and keeps its output.
status=0
bindir=$(mktemp -d)
trap 'rm -rf "$bindir"' EXIT
for dir in "${!tests[@]}"; do
	run="^(${tests[$dir]})\$"
	echo "flaky: ./$dir: $run, -race, $count runs"
	[[ -z ${LIST:-} ]] || continue
	bin="$bindir/$(echo "$dir" | tr / _).test"
	if ! go test -race -c -o "$bin" "./$dir"; then
		status=1
		continue
	fi
	for ((i = 1; i <= count; i++)); do
		log="$bindir/run.log"
		if ! (cd "$dir" && "$bin" -test.run "$run" -test.count=1 -test.timeout=30m >"$log" 2>&1); then
			cat "$log"
			echo "flaky: ./$dir: FAIL in run $i of $count"
			status=1
			break
		fi
		echo "flaky: ./$dir: run $i of $count passed"
	done
done
exit $status
