#!/bin/sh
# Draw docs/runtime-objects.svg from what scripts/check-runtime-objects.sh
# finds in a build's runtime objects (docs/runtime-objects.dot, which
# `make layering` holds the build to). Needs Graphviz's dot (Debian:
# graphviz; installed here when run as root).
# Usage: scripts/runtime-objects-svg.sh [BUILD]
set -eu
build=${1:-build}
if ! command -v dot >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ]; then
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q graphviz >/dev/null
    else
        echo "runtime-objects-svg: needs Graphviz's dot (apt-get install graphviz)" >&2
        exit 1
    fi
fi
sh scripts/check-runtime-objects.sh "$build" --dot docs/runtime-objects.dot
dot -Tsvg docs/runtime-objects.dot -o docs/runtime-objects.svg
echo "docs/runtime-objects.svg drawn from docs/runtime-objects.dot"
