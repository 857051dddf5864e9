#!/usr/bin/env bash
# Fetches ONNX Runtime's CPU shared library out of the onnxruntime-node npm
# package and installs it at the given path, checked against a pinned SHA-256.
#
#   scripts/fetch-ort.sh VERSION SHA256 DEST
#
# Registry fetches sometimes stall (npm's default fetch timeout is five
# minutes, and a stalled 110 MB download once failed a CI run that way), so
# every attempt has a short stall timeout, a hard wall-clock bound, and the
# whole fetch is retried with backoff. npm's own errors stay visible.
set -euo pipefail

version=${1:?version}
want_sha=${2:?sha256}
dest=${3:?destination path}
attempts=${ORT_FETCH_ATTEMPTS:-5}
inner=package/bin/napi-v6/linux/x64/libonnxruntime.so.1

work=$(mktemp -d "${TMPDIR:-/tmp}/scorer-ort.XXXXXX")
trap 'rm -rf "$work"' EXIT

fetch() {
	# A private cache keeps a half-written entry from a killed attempt (or a
	# read-only home directory) from breaking the next one.
	rm -rf "$work/pkg" "$work/cache"
	mkdir -p "$work/pkg"
	(cd "$work/pkg" && timeout 300 npm pack "onnxruntime-node@$version" \
		--cache "$work/cache" --prefer-online --no-audit --no-fund --loglevel=warn \
		--fetch-timeout=60000 --fetch-retries=2 \
		--fetch-retry-mintimeout=2000 --fetch-retry-maxtimeout=15000 >/dev/null)
}

for ((i = 1; i <= attempts; i++)); do
	if fetch; then
		break
	fi
	if ((i == attempts)); then
		echo "fetch-ort: npm pack onnxruntime-node@$version failed $attempts times" >&2
		exit 1
	fi
	echo "fetch-ort: attempt $i of $attempts failed; retrying in $((i * 5)) s" >&2
	sleep $((i * 5))
done

tar -xzf "$work/pkg/onnxruntime-node-$version.tgz" -C "$work" "$inner"
got_sha=$(sha256sum "$work/$inner" | cut -d' ' -f1)
if [[ $got_sha != "$want_sha" ]]; then
	echo "fetch-ort: $inner has SHA-256 $got_sha, want $want_sha" >&2
	exit 1
fi
mkdir -p "$(dirname "$dest")"
# Rename within the destination directory so an interrupted install never
# leaves a truncated library where make would take it as done.
cp "$work/$inner" "$dest.tmp"
mv "$dest.tmp" "$dest"
echo "fetch-ort: installed ONNX Runtime $version at $dest"
