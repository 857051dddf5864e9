#!/usr/bin/env bash
# Makes promtool (Prometheus's rule checker and rule unit-test runner, which
# `go test ./deploy` runs on the alerting rules) available to `make test`:
#
#   scripts/install-promtool.sh DIR
#
# promtool on PATH already: nothing to do. Otherwise Debian's prometheus
# package is downloaded (not installed: that would also install and start a
# Prometheus server) with a private apt state, and its promtool, which needs
# only libc, is unpacked to DIR/bin/promtool. Works with or without root.
# The Makefile puts DIR/bin first on PATH.
set -euo pipefail

dir=$(mkdir -p "${1:?install directory}" && cd "$1" && pwd)
here=$(cd "$(dirname "$0")" && pwd)

if command -v promtool >/dev/null 2>&1; then
	exit 0
fi

state=$dir/apt
mkdir -p "$state/lists/partial" "$state/cache/archives/partial" "$dir/bin" "$dir/debs"
aptopts=(-o "Dir::State::Lists=$state/lists" -o "Dir::Cache=$state/cache"
	-o "Dir::Cache::archives=$state/cache/archives" -o "Dir::State::status=/var/lib/dpkg/status"
	-o Debug::NoLocking=1 -o Acquire::Retries=3)
"$here/retry.sh" 3 apt-get "${aptopts[@]}" update -qq
rm -f "$dir"/debs/prometheus_*.deb
(cd "$dir/debs" && "$here/retry.sh" 3 apt-get "${aptopts[@]}" download prometheus >/dev/null)
root=$(mktemp -d "$dir/root.XXXXXX")
dpkg-deb -x "$dir"/debs/prometheus_*.deb "$root"
mv "$root/usr/bin/promtool" "$dir/bin/promtool.tmp"
rm -rf "$root"
mv "$dir/bin/promtool.tmp" "$dir/bin/promtool"
"$dir/bin/promtool" --version >/dev/null
echo "install-promtool: promtool at $dir/bin/promtool" >&2
