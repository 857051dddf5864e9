#!/usr/bin/env bash
# Fetches ONNX Runtime's shared libraries out of npm packages, checks each
# against a pinned SHA-256 and installs it:
#
#   scripts/fetch-ort.sh --pins PINS SET DESTDIR
#       every row of the pin list PINS (deploy/ort/pins.txt) whose set is SET
#       ("cpu": the core alone; "cuda": a core and its CUDA provider
#       libraries), installed in DESTDIR under its installed name (`make ort`,
#       `make cuda-ort`, both images).
#
# Registry fetches sometimes stall (npm's default fetch timeout is five
# minutes, and a stalled 110 MB download once failed a CI run that way), so
# every attempt has a short stall timeout, a hard wall-clock bound, and the
# whole fetch is retried with backoff. npm's own errors stay visible.
set -euo pipefail

attempts=${ORT_FETCH_ATTEMPTS:-5}
if [[ ${1:-} != --pins || $# -ne 4 ]]; then
	echo "usage: fetch-ort.sh --pins PINS SET DESTDIR" >&2
	exit 2
fi
pins=$2
set_name=$3
destdir=$4
work=$(mktemp -d "${TMPDIR:-/tmp}/scorer-ort.XXXXXX")
trap 'rm -rf "$work"' EXIT

# rows: "package@version inner-path installed-name sha256", one per line.
rows=()
while read -r set spec inner name sha; do
	[[ -z $set || $set == \#* ]] && continue
	if [[ -z $sha || ! $sha =~ ^[0-9a-f]{64}$ ]]; then
		echo "fetch-ort: $pins: bad row: $set $spec $inner $name $sha" >&2
		exit 1
	fi
	if [[ $set == "$set_name" ]]; then
		rows+=("$spec $inner $name $sha")
	fi
done <"$pins"
if ((${#rows[@]} == 0)); then
	echo "fetch-ort: $pins has no row for set $set_name" >&2
	exit 1
fi

pack() {
	local spec=$1 dir=$2
	# A private cache keeps a half-written entry from a killed attempt (or a
	# read-only home directory) from breaking the next one.
	rm -rf "$dir" "$work/cache"
	mkdir -p "$dir"
	(cd "$dir" && timeout 300 npm pack "$spec" \
		--cache "$work/cache" --prefer-online --no-audit --no-fund --loglevel=warn \
		--fetch-timeout=60000 --fetch-retries=2 \
		--fetch-retry-mintimeout=2000 --fetch-retry-maxtimeout=15000 >/dev/null)
}

fetch() {
	local spec=$1 dir=$2
	for ((i = 1; i <= attempts; i++)); do
		if pack "$spec" "$dir"; then
			return 0
		fi
		if ((i == attempts)); then
			echo "fetch-ort: npm pack $spec failed $attempts times" >&2
			exit 1
		fi
		echo "fetch-ort: attempt $i of $attempts for $spec failed; retrying in $((i * 5)) s" >&2
		sleep $((i * 5))
	done
}

# Fetch each package once, extract and check every file before installing
# any, so a bad pin never leaves a half-updated directory.
declare -A packed
sums=$work/SHA256SUMS
: >"$sums"
for row in "${rows[@]}"; do
	read -r spec inner name sha <<<"$row"
	dir=$work/pkg-${spec//[^A-Za-z0-9._-]/_}
	if [[ -z ${packed[$spec]:-} ]]; then
		fetch "$spec" "$dir"
		packed[$spec]=$dir
	fi
	mkdir -p "$work/out"
	tar -xzf "$dir"/*.tgz -C "$dir" "$inner"
	mv "$dir/$inner" "$work/out/$name"
	printf '%s  %s\n' "$sha" "$work/out/$name" >>"$sums"
done
if ! sha256sum --strict --quiet -c "$sums" >&2; then
	echo "fetch-ort: SHA-256 mismatch against the pins (got below)" >&2
	(cd "$work/out" && sha256sum -- *) >&2
	exit 1
fi
mkdir -p "$destdir"
# Rename within the destination directory so an interrupted install never
# leaves a truncated library where make would take it as done.
for f in "$work"/out/*; do
	name=$(basename "$f")
	cp "$f" "$destdir/$name.tmp"
	chmod 0644 "$destdir/$name.tmp"
	mv "$destdir/$name.tmp" "$destdir/$name"
	echo "fetch-ort: installed $name at $destdir"
done
