#!/usr/bin/env bash
# `make image` / `make image-cuda`: builds one of deploy/docker's Dockerfiles
# with docker when a Docker engine answers, else with podman.
#
#   scripts/image-build.sh DOCKERFILE TAG [extra build flags...]
#
# The build context is the repository root and the ignore rules are
# DOCKERFILE.dockerignore. The host's `go env GOPROXY` is passed as the GOPROXY
# build arg. IMAGE_BUILDER=podman forces podman where docker exists.
#
# LOCAL_BASES=1 (podman only; what `make image-test` uses) builds FROM base
# images made on this machine by scripts/image-bases.sh instead of pulling
# them from a registry, and puts this host's module cache first in GOPROXY
# (mounted read-only into the build), so no module is fetched twice.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
cd "$root"
file=${1:?Dockerfile}
tag=${2:?image tag}
shift 2

goproxy=$(go env GOPROXY 2>/dev/null || true)
args=()
# The binary's version (scorer_build_info{version}): the build context has no
# .git, so it is stamped here. VERSION from the environment wins.
args+=(--build-arg "VERSION=${VERSION:-$(git describe --tags --always --dirty 2>/dev/null || echo dev)}")
if [[ -n $goproxy ]]; then
	args+=(--build-arg "GOPROXY=$goproxy")
fi

if [[ ${IMAGE_BUILDER:-} != podman ]] && command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; then
	if [[ ${LOCAL_BASES:-0} == 1 ]]; then
		echo "image-build: LOCAL_BASES=1 needs podman (IMAGE_BUILDER=podman)" >&2
		exit 2
	fi
	set -x
	exec docker build -f "$file" -t "$tag" "${args[@]}" "$@" .
fi
if ! command -v podman >/dev/null 2>&1; then
	echo "image-build: no Docker engine answers and podman is not installed (apt-get install podman runc)" >&2
	exit 1
fi
# shellcheck source=podman-env.sh
source "$here/podman-env.sh" "$root/.deps"
# --skip-unused-stages=false: buildah (podman 4) does not see that
# `FROM ${MODEL_SRC}` needs the model-none stage, skips it, then tries to
# pull an image named model-none.
popts=(--isolation="$BUILDAH_ISOLATION" --skip-unused-stages=false --ignorefile "$file.dockerignore")
if [[ ${LOCAL_BASES:-0} == 1 ]]; then
	read -ra bases <<<"$("$here/image-bases.sh" "$root/.deps" | tail -n1)"
	args+=("${bases[@]}")
	modcache=$(go env GOMODCACHE)/cache/download
	if [[ -d $modcache ]]; then
		args+=(--build-arg "GOPROXY=file:///gomodproxy${goproxy:+,$goproxy}")
		popts+=(-v "$modcache:/gomodproxy:ro")
	fi
fi
set -x
pm build "${popts[@]}" -f "$file" -t "$tag" "${args[@]}" "$@" .
