#!/usr/bin/env bash
# Sourced by the image scripts: how podman runs on these machines, where the
# packaged defaults do not work.
#
#   source scripts/podman-env.sh DEPS_DIR   then   pm build ... / pm run ...
#
# crun fails on this kernel's hybrid cgroup layout, so every call names runc;
# the systemd cgroup manager and the default ulimits need a systemd session
# and privileges a CI container lacks, hence the CONTAINERS_CONF written here
# (a user's own CONTAINERS_CONF is left alone).
podman_deps=$(mkdir -p "${1:?deps dir}/podman" && cd "$1/podman" && pwd)
if [[ -z ${CONTAINERS_CONF:-} ]]; then
	cat >"$podman_deps/containers.conf" <<'CONF'
[containers]
default_ulimits = []

[engine]
cgroup_manager = "cgroupfs"
CONF
	export CONTAINERS_CONF=$podman_deps/containers.conf
fi
export PODMAN_RUNTIME=${PODMAN_RUNTIME:-$(command -v runc || echo /usr/sbin/runc)}
export BUILDAH_ISOLATION=${BUILDAH_ISOLATION:-chroot}

pm() {
	podman --runtime "$PODMAN_RUNTIME" "$@"
}
