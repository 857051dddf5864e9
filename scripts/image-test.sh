#!/usr/bin/env bash
# `make image-test`: builds the CPU image from deploy/docker/Dockerfile with
# podman (base images made locally, see image-bases.sh) and runs it the way a
# user does: non-root, read-only root file system, the model mounted
# read-only at /models, against `scorer broker` on this host. The checks live
# in deploy's TestImage (SCORER_IMAGE names the image): /readyz 200, real
# transcripts produced with kcat come back scored, SIGTERM exits 0 within
# SHUTDOWN_TIMEOUT with every offset committed. Then the CUDA Dockerfile's
# ORT stage is checked (image-cuda-check.sh).
#
# Skipped, with the reason, only where podman cannot run at all (not
# installable without root, or `podman info` fails); any later failure fails.
#
# IMAGE_TEST_BUILD_ONLY=1 builds the image and stops: `make test` runs that
# beside the Go tests (the build is minutes of compiling and unpacking while
# the Go tests leave a core idle at times), then this script in full, whose
# build is then a cache hit and whose run has the machine to itself.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
cd "$root"
image=${IMAGE_TEST_TAG:-localhost/scorer:image-test}

skip() {
	echo "image-test: SKIPPED: podman cannot run here: $*" >&2
	echo "image-test: the container image was NOT built or run" >&2
	exit 0
}

if ! "$here/install-podman.sh"; then
	skip "podman, runc or debootstrap is missing and could not be installed (needs root or password-less sudo)"
fi
# shellcheck source=podman-env.sh
source "$here/podman-env.sh" "$root/.deps"
if ! info=$(pm info 2>&1); then
	skip "\`podman info\` failed: $(tail -n3 <<<"$info")"
fi

start=$SECONDS
# TestImage checks the binary reports the version the build stamped.
VERSION=${VERSION:-$(git describe --tags --always --dirty 2>/dev/null || echo dev)}
export VERSION
IMAGE_BUILDER=podman LOCAL_BASES=1 "$here/image-build.sh" deploy/docker/Dockerfile "$image"
echo "image-test: built $image in $((SECONDS - start)) s" >&2
if [[ -n ${IMAGE_TEST_BUILD_ONLY:-} ]]; then
	exit 0
fi

SCORER_IMAGE=$image SCORER_IMAGE_VERSION=$VERSION go test -count=1 -timeout 10m -run '^TestImage$' -v ./deploy

"$here/image-cuda-check.sh"
echo "image-test: done in $((SECONDS - start)) s" >&2
