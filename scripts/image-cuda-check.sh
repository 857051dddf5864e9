#!/usr/bin/env bash
# Part of `make image-test`: deploy/docker/Dockerfile.cuda built as far as a
# machine without the CUDA base image can, and the ONNX Runtime files it
# would ship compared with the pinned CUDA set `make cuda-ort` installs.
#
# The CUDA base is replaced by the local Debian base (CUDA_IMAGE stand-in),
# so the whole Dockerfile runs: the Go build, the ORT stage (npm fetch and
# checksum checks) and the runtime stage's layout. Where the runtime stage
# cannot build on the stand-in, the ort stage alone is built and checked,
# and that is said. Then /opt/onnxruntime/lib of the image (names, symlink
# targets, SHA-256 of every file) must equal .deps/ort-cuda/, which
# `make cuda-ort` fills with the same pinned files. Without a cuda-ort target
# in the Makefile the comparison is skipped, loudly, and the image's files
# are listed.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
cd "$root"
# shellcheck source=podman-env.sh
source "$here/podman-env.sh" "$root/.deps"
tag=${IMAGE_TEST_TAG:-localhost/scorer:image-test}-cuda
make=${MAKE:-make}
work=$(mktemp -d "${TMPDIR:-/tmp}/scorer-cuda-check.XXXXXX")
trap 'rm -rf "$work"' EXIT

standin=$("$here/image-bases.sh" "$root/.deps" | tail -n1 | grep -o 'RUNTIME_IMAGE=[^ ]*' | cut -d= -f2)
build() {
	IMAGE_BUILDER=podman LOCAL_BASES=1 "$here/image-build.sh" deploy/docker/Dockerfile.cuda "$tag" \
		--build-arg "CUDA_IMAGE=$standin" "$@"
}
target=runtime
if ! build --target runtime >"$work/build.log" 2>&1; then
	tail -n 30 "$work/build.log" >&2
	echo "image-cuda-check: the runtime stage does not build on the stand-in base ($standin);" \
		"checking the ort stage alone" >&2
	target=ort
	if ! build --target ort >"$work/build.log" 2>&1; then
		tail -n 40 "$work/build.log" >&2
		echo "image-cuda-check: FAILED: the ort stage of Dockerfile.cuda does not build" >&2
		exit 1
	fi
fi
echo "image-cuda-check: built Dockerfile.cuda up to stage '$target' (CUDA_IMAGE=$standin)" >&2

cid=$(pm create "$tag")
pm cp "$cid:/opt/onnxruntime/lib" "$work/image" >/dev/null
pm rm "$cid" >/dev/null

# list DIR: one line per entry: name, type, then the symlink target or the
# file's SHA-256.
list() {
	(cd "$1" && find . -mindepth 1 -printf '%P\t%y\t%l\n' | sort | while IFS=$'\t' read -r name type link; do
		if [[ $type == f ]]; then
			printf '%s file %s\n' "$name" "$(sha256sum "$name" | cut -d' ' -f1)"
		else
			printf '%s %s %s\n' "$name" "$type" "$link"
		fi
	done)
}
list "$work/image" >"$work/image.list"

if ! "$make" -n cuda-ort >/dev/null 2>&1; then
	echo "image-cuda-check: SKIPPED the library comparison: this Makefile has no cuda-ort target" \
		"(the GPU work adds it). /opt/onnxruntime/lib of the CUDA image holds:" >&2
	sed 's/^/  /' "$work/image.list" >&2
	exit 0
fi
"$make" --no-print-directory cuda-ort >&2
list .deps/ort-cuda >"$work/deps.list"
if ! diff -u "$work/deps.list" "$work/image.list" >&2; then
	echo "image-cuda-check: FAILED: the CUDA image's /opt/onnxruntime/lib (+) differs from .deps/ort-cuda (-)" >&2
	exit 1
fi
echo "image-cuda-check: /opt/onnxruntime/lib of the CUDA image equals .deps/ort-cuda:" >&2
sed 's/^/  /' "$work/image.list" >&2
