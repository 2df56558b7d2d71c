#!/bin/sh
# Installs the Debian packages graft needs to build, test and run.
# As root: installs whatever is missing. Otherwise: prints the exact apt-get
# command and fails, so nothing is half set up.
set -eu

PACKAGES="build-essential pkg-config \
libucx-dev ucx-utils \
libcurl4-openssl-dev libssl-dev \
libprotobuf-c-dev protobuf-c-compiler \
libzstd-dev libxxhash-dev \
etcd-server etcd-client \
libjansson-dev libcmocka-dev \
iproute2 procps \
python3-venv python3-pytest python3-build python3-setuptools python3-wheel \
clang libclang-rt-dev \
libmicrohttpd-dev chromium python3-prometheus-client prometheus \
python3-torch python3-numpy python3-cffi"

missing=""
for p in $PACKAGES; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
        missing="$missing $p"
    fi
done

if [ -z "$missing" ]; then
    exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
    echo "graft: missing Debian packages:$missing" >&2
    echo "graft: run as root:  apt-get update && apt-get install -y$missing" >&2
    exit 1
fi

echo "graft: installing$missing"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq </dev/null
apt-get install -y -qq --no-install-recommends $missing </dev/null
