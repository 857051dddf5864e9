#!/usr/bin/env bash
# Makes kcat (the independent Kafka client the interop tests talk to)
# available to `make test`:
#
#   scripts/install-kcat.sh DIR
#
# kcat on PATH already: nothing to do. Root (or password-less sudo): Debian's
# package, installed system-wide. Otherwise, without any privilege: the .deb
# files of kcat and the libraries a minimal Debian lacks are downloaded with a
# private apt state, unpacked under DIR, and DIR/bin/kcat is a wrapper that
# points the loader at them. The Makefile puts DIR/bin first on PATH.
# KCAT_INSTALL=local forces the unprivileged route (to check it as root).
set -euo pipefail

dir=$(mkdir -p "${1:?install directory}" && cd "$1" && pwd)
here=$(cd "$(dirname "$0")" && pwd)

mode=${KCAT_INSTALL:-auto}
if [[ $mode == auto ]] && command -v kcat >/dev/null 2>&1; then
	exit 0
fi

apt_install() {
	"$@" apt-get update -qq -o Acquire::Retries=3 &&
		DEBIAN_FRONTEND=noninteractive "$@" apt-get install -y -qq -o Acquire::Retries=3 kcat >/dev/null
}

if [[ $mode == auto && $(id -u) == 0 ]]; then
	"$here/retry.sh" 3 bash -c "$(declare -f apt_install); apt_install"
	exit 0
fi
if [[ $mode == auto ]] && command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
	"$here/retry.sh" 3 bash -c "$(declare -f apt_install); apt_install sudo -n"
	exit 0
fi

echo "install-kcat: not root and no password-less sudo; unpacking Debian's kcat under $dir" >&2
state=$dir/apt
root=$dir/root
mkdir -p "$state/lists/partial" "$state/cache/archives/partial" "$root" "$dir/bin" "$dir/debs"
aptopts=(-o "Dir::State::Lists=$state/lists" -o "Dir::Cache=$state/cache"
	-o "Dir::Cache::archives=$state/cache/archives" -o "Dir::State::status=/var/lib/dpkg/status"
	-o Debug::NoLocking=1 -o Acquire::Retries=3)
"$here/retry.sh" 3 apt-get "${aptopts[@]}" update -qq
# kcat and its direct libraries; everything else it links (libc, ssl, zstd,
# lz4, zlib) is in every Debian base.
(cd "$dir/debs" && "$here/retry.sh" 3 apt-get "${aptopts[@]}" download \
	kcat librdkafka1 libyajl2 libsasl2-2 libsasl2-modules-db libdb5.3 >/dev/null)
for deb in "$dir"/debs/*.deb; do
	dpkg-deb -x "$deb" "$root"
done
libs=$(find "$root" -name '*.so*' -printf '%h\n' | sort -u | paste -sd:)
cat >"$dir/bin/kcat" <<EOF
#!/bin/sh
LD_LIBRARY_PATH="$libs\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}" exec "$root/usr/bin/kcat" "\$@"
EOF
chmod +x "$dir/bin/kcat"
"$dir/bin/kcat" -V >/dev/null
echo "install-kcat: kcat at $dir/bin/kcat" >&2
