#!/bin/sh
# Fetches a newer UCX than Debian 12's 1.13 (PyPI's libucx-cu12 wheel: UCX's
# own libraries, headers and modules; its CUDA modules load only where CUDA
# is) and unpacks it into DIR, for `make UCX_PREFIX=DIR/libucx`. UCX 1.22
# fixed the stale descriptor events that a flood of connections trips in
# 1.13 (docs/SECURITY.md, "What stays exposed").
#   usage: scripts/ucx-pypi.sh DIR [VERSION]
set -eu
dir=${1:?usage: scripts/ucx-pypi.sh DIR [VERSION]}
version=${2:-1.22.0}
if [ -f "$dir/libucx/lib/libucp.so" ] && [ -f "$dir/.version-$version" ]; then
    echo "$dir/libucx"
    exit 0
fi
mkdir -p "$dir"
# pip from a venv of Debian's python3 (Debian's python3 has no pip module).
if [ ! -x "$dir/venv/bin/python" ]; then
    /usr/bin/python3 -m venv "$dir/venv" >&2
fi
"$dir/venv/bin/python" -m pip download -q --disable-pip-version-check --no-deps \
    --only-binary=:all: -d "$dir" "libucx-cu12==$version" </dev/null >&2
wheel=$(ls "$dir"/libucx_cu12-"$version"-*.whl | head -n 1)
"$dir/venv/bin/python" -m zipfile -e "$wheel" "$dir" >&2
touch "$dir/.version-$version"
echo "$dir/libucx"
