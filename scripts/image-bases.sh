#!/usr/bin/env bash
# Makes the base images deploy/docker/Dockerfile builds FROM, locally, for
# machines that reach no image registry (CI here):
#
#   scripts/image-bases.sh DEPS_DIR      prints the --build-arg flags to use
#
#   localhost/scorer-base/debian:bookworm   debootstrap --variant=minbase (RUNTIME_IMAGE)
#   localhost/scorer-base/golang:GOVERSION  the same + gcc, libc6-dev and this host's GOROOT (GO_IMAGE)
#   localhost/scorer-base/node:NODEVERSION  the same + this host's node and npm (NODE_IMAGE)
#
# The build-stage bases (Go, node) also trust what this host trusts: its CA
# bundle is added as /etc/ssl/host-ca.crt and named by SSL_CERT_FILE and
# NODE_EXTRA_CA_CERTS, so module and npm fetches work behind a TLS-inspecting
# proxy. The runtime base gets nothing of the host's.
#
# The Debian mirror is the one apt on this host uses (read from its sources at
# run time, never written into the repository). Root file systems are cached
# as tarballs under DEPS_DIR/image-bases, so a second run only re-imports them
# (or does nothing when podman still has the images).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
deps=$(mkdir -p "${1:?deps dir}" && cd "$1" && pwd)
# shellcheck source=podman-env.sh
source "$here/podman-env.sh" "$deps"
cache=$deps/image-bases
mkdir -p "$cache/debs"
suite=bookworm
goroot=$(go env GOROOT)
goversion=$(go env GOVERSION | sed 's/^go//')
node_bin=$(command -v node)
nodeversion=$(node --version | sed 's/^v//')
host_ca=${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}
npm_dir=$(dirname "$(dirname "$(readlink -f "$(command -v npm)")")")

# mirror prints the first http(s) URI apt uses for the main suite.
mirror() {
	local f
	for f in /etc/apt/sources.list.d/*.sources; do
		[[ -e $f ]] || continue
		awk -v suite="$suite" '
			/^[[:space:]]*$/ { if (uri != "" && ok) { print uri; exit } uri = ""; ok = 0; next }
			/^URIs:/ { uri = $2 }
			/^Suites:/ { for (i = 2; i <= NF; i++) if ($i == suite) ok = 1 }
			END { if (uri != "" && ok) print uri }' "$f" | head -n1
	done
	if [[ -e /etc/apt/sources.list ]]; then
		awk -v suite="$suite" '$1 == "deb" && $3 == suite { print $2; exit }' /etc/apt/sources.list
	fi
}

# rootfs NAME PACKAGES: a cached minbase tarball with PACKAGES included.
rootfs() {
	local name=$1 include=$2 tarball=$cache/$1.tar
	if [[ -s $tarball ]]; then
		return
	fi
	local m
	m=$(mirror | head -n1)
	if [[ -z $m ]]; then
		echo "image-bases: no Debian $suite mirror found in apt's sources" >&2
		exit 1
	fi
	local dir
	dir=$(mktemp -d "$cache/$name.XXXXXX")
	echo "image-bases: debootstrap $suite ($name, +${include:-nothing}) from apt's mirror" >&2
	"$here/retry.sh" 3 debootstrap --variant=minbase ${include:+--include="$include"} \
		--cache-dir="$cache/debs" "$suite" "$dir" "$m" >"$cache/$name.log" 2>&1 ||
		{ tail -20 "$cache/$name.log" >&2; exit 1; }
	rm -rf "$dir"/var/cache/apt/archives/*.deb "$dir"/var/lib/apt/lists/*_Packages
	tar -C "$dir" -cf "$tarball.tmp" .
	rm -rf "$dir"
	mv "$tarball.tmp" "$tarball"
}

# image REF TARBALL [--change ...]: imports TARBALL as REF unless podman has it.
image() {
	local ref=$1 tarball=$2
	shift 2
	if pm image exists "$ref"; then
		return
	fi
	pm import "$@" "$tarball" "$ref" >/dev/null
}

path=/usr/local/go/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
runtime_ref=localhost/scorer-base/debian:$suite
go_ref=localhost/scorer-base/golang:$goversion
node_ref=localhost/scorer-base/node:$nodeversion

# A fresh clone has an empty DEPS_DIR while podman's storage, outside the
# clone, may still hold the images: bootstrap a rootfs only for an image
# that is missing (debootstrap is most of a cold run's time).
if ! pm image exists "$runtime_ref" || ! pm image exists "$node_ref"; then
	rootfs debian ca-certificates
fi
if ! pm image exists "$go_ref"; then
	rootfs debian-gcc ca-certificates,gcc,libc6-dev
fi
image "$runtime_ref" "$cache/debian.tar" --change "ENV PATH=$path" --change 'CMD ["/bin/bash"]'

# The Go and node layers are the host's own toolchains, added to the cached
# rootfs tarballs (tar --append of a copy, so the cached rootfs stays clean).
if ! pm image exists "$go_ref"; then
	t=$cache/golang-$goversion.tar
	if [[ ! -s $t ]]; then
		cp "$cache/debian-gcc.tar" "$t.tmp"
		tar -C "$(dirname "$host_ca")" --transform "s,^$(basename "$host_ca")\$,./etc/ssl/host-ca.crt," \
			-rhf "$t.tmp" "$(basename "$host_ca")"
		tar -C "$(dirname "$goroot")" --transform "s,^$(basename "$goroot"),usr/local/go," \
			--exclude="$(basename "$goroot")/pkg/tool/*/race*" -rf "$t.tmp" "$(basename "$goroot")"
		mv "$t.tmp" "$t"
	fi
	image "$go_ref" "$t" --change "ENV PATH=$path" --change "ENV GOPATH=/go" \
		--change "ENV SSL_CERT_FILE=/etc/ssl/host-ca.crt" --change 'CMD ["/bin/bash"]'
fi
if ! pm image exists "$node_ref"; then
	t=$cache/node-$nodeversion.tar
	if [[ ! -s $t ]]; then
		stage=$(mktemp -d "$cache/node.XXXXXX")
		mkdir -p "$stage/usr/local/bin" "$stage/usr/local/lib/node_modules"
		cp "$node_bin" "$stage/usr/local/bin/node"
		cp -a "$npm_dir" "$stage/usr/local/lib/node_modules/npm"
		ln -s ../lib/node_modules/npm/bin/npm-cli.js "$stage/usr/local/bin/npm"
		mkdir -p "$stage/etc/ssl"
		cp "$host_ca" "$stage/etc/ssl/host-ca.crt"
		cp "$cache/debian.tar" "$t.tmp"
		# Only new paths: a directory the rootfs already has would be a
		# duplicate entry, which podman import refuses.
		tar -C "$stage" -rf "$t.tmp" ./usr/local/bin/node ./usr/local/bin/npm \
			./usr/local/lib/node_modules ./etc/ssl/host-ca.crt
		rm -rf "$stage"
		mv "$t.tmp" "$t"
	fi
	image "$node_ref" "$t" --change "ENV PATH=$path" \
		--change "ENV NODE_EXTRA_CA_CERTS=/etc/ssl/host-ca.crt" --change 'CMD ["/bin/bash"]'
fi

echo "--build-arg RUNTIME_IMAGE=$runtime_ref --build-arg GO_IMAGE=$go_ref --build-arg NODE_IMAGE=$node_ref"
