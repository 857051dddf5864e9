#!/usr/bin/env bash
# Where the test suite's time goes: runs `go test -json -count=1` and prints
# each package's wall and CPU time and the slowest tests, so the long poles are named
# by measurement, not by guess (docs/testing.md):
#
#   scripts/test-times.sh                       # go test -race -p 4 -timeout 45m ./... (make test's main phase)
#   scripts/test-times.sh -short ./...          # the inner loop
#   scripts/test-times.sh -race ./model ./cmd/scorer
#   TOP=40 SUBTESTS=1 scripts/test-times.sh …   # more rows; subtests too
#   IN=bin/test-times.json scripts/test-times.sh   # re-read a saved run, run nothing
#
# Arguments go to `go test` after `-json -count=1` (a later -count wins);
# none means `-race -p 4 -timeout 45m ./...`. The raw events are kept in $JSON (default
# bin/test-times.json). A package's time is go test's own elapsed for it
# (its tests in parallel, build excluded) and the CPU time its test binary
# and children used (user + sys, through -exec: the measure that a busy
# machine distorts least); a test's is its own elapsed, so a t.Parallel
# test's overlaps its neighbours'. Exit status: go test's.
# Needs only bash, awk and sort.
set -uo pipefail
# As go test's -exec: runs one test binary and reports the CPU time it and
# its children used, so a package's CPU appears beside its wall time (wall
# alone says little on a shared machine).
if [[ ${1:-} == --exec ]]; then
	shift
	"$@"
	rc=$?
	f=$(mktemp)
	times >"$f" # not in a pipe: a subshell has no children
	read -r user sys < <(tail -n1 "$f")
	rm -f "$f"
	echo "test-times-cpu: user $user sys $sys"
	exit $rc
fi
cd "$(dirname "$0")/.."
top=${TOP:-20}
json=${JSON:-bin/test-times.json}
status=0
if [[ -n ${IN:-} ]]; then
	json=$IN
else
	mkdir -p "$(dirname "$json")"
	[[ $# -gt 0 ]] || set -- -race -p 4 -timeout 45m ./...
	start=$(date +%s)
	echo "test-times: go test -json -count=1 $*" >&2
	# Failures are shown as they happen; everything else goes to the file.
	go test -json -count=1 -exec "$PWD/scripts/test-times.sh --exec" "$@" >"$json" || status=$?
	echo "test-times: $(($(date +%s) - start)) s wall (build included), events in $json" >&2
fi

# One row per finished package or test: kind, seconds, result, name.
mod=$(awk '$1 == "module" { print $2; exit }' go.mod)
rows=$(awk -v mod="$mod/" '
	function field(name,   re, v) {
		re = "\"" name "\":\"[^\"]*\""
		if (!match($0, re)) return ""
		v = substr($0, RSTART + length(name) + 4, RLENGTH - length(name) - 5)
		return v
	}
	function secs(s,   m) { # bash times: 1m2.345s
		m = s; sub(/m.*/, "", m); sub(/^[0-9]*m/, "", s); sub(/s$/, "", s)
		return m * 60 + s
	}
	function short(pkg) { return index(pkg, mod) == 1 ? substr(pkg, length(mod) + 1) : pkg }
	/"Output":"test-times-cpu: / {
		match($0, /user [0-9]+m[0-9.]+s sys [0-9]+m[0-9.]+s/)
		split(substr($0, RSTART, RLENGTH), f, " ")
		cpu[short(field("Package"))] = secs(f[2]) + secs(f[4])
	}
	/"Action":"(pass|fail|skip)"/ && /"Elapsed":/ {
		act = field("Action"); pkg = short(field("Package")); test = field("Test")
		match($0, /"Elapsed":[0-9.e+-]+/); el = substr($0, RSTART + 10, RLENGTH - 10) + 0
		if (test == "") pkgs[pkg] = sprintf("%.2f %s", el, act)
		else printf "test %.2f %s %s %s\n", el, act, pkg, test
	}
	END { for (p in pkgs) { split(pkgs[p], v, " "); printf "pkg %s %s %s %s\n", v[1], v[2], p, (p in cpu) ? sprintf("%.1f", cpu[p]) : "-" } }' "$json")

echo
echo "packages, slowest first (wall and CPU seconds of the test binary and its children; result):"
echo "     wall      cpu"
grep '^pkg ' <<<"$rows" | sort -k2,2 -gr | awk '
	{ printf "%9.1f %8s  %-4s  %s\n", $2, $5, $3, $4; sum += $2; cpu += $5 }
	END { printf "%9.1f %8.1f        sum (packages run in parallel: wall is less)\n", sum, cpu }'
echo
if [[ -n ${SUBTESTS:-} ]]; then
	echo "the $top slowest tests and subtests (seconds; result):"
	sub=1
else
	echo "the $top slowest tests (seconds; result; SUBTESTS=1 adds subtests):"
	sub=0
fi
grep '^test ' <<<"$rows" | awk -v all="$sub" 'all || $5 !~ /\//' | sort -k2,2 -gr | head -n "$top" |
	awk '{ printf "%9.1f  %-4s  %s %s\n", $2, $3, $4, $5 }'
fails=$(grep -c '^[a-z]* [^ ]* fail ' <<<"$rows" || true)
[[ $fails -eq 0 ]] || echo "test-times: $fails failed (see $json)" >&2
exit $status
