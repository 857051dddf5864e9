#!/usr/bin/env bash
# Installs what `make image-test` needs from Debian: podman, runc (crun fails
# on these kernels' hybrid cgroups) and debootstrap (base images are made
# locally; no image registry is reachable from CI). Root or password-less
# sudo only: exits 3 when neither is available, which image-test reports
# as "podman cannot run here".
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)

if command -v podman >/dev/null 2>&1 && command -v runc >/dev/null 2>&1 && command -v debootstrap >/dev/null 2>&1; then
	exit 0
fi
sudo=()
if [[ $(id -u) != 0 ]]; then
	if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
		sudo=(sudo -n)
	else
		echo "install-podman: not root and no password-less sudo" >&2
		exit 3
	fi
fi
export DEBIAN_FRONTEND=noninteractive
"$here/retry.sh" 3 "${sudo[@]}" apt-get update -qq -o Acquire::Retries=3
"$here/retry.sh" 3 "${sudo[@]}" apt-get install -y -qq -o Acquire::Retries=3 --no-install-recommends \
	podman runc debootstrap uidmap fuse-overlayfs ca-certificates >/dev/null
