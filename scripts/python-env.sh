#!/bin/sh
# Makes the Python environment the pytest suites run in: $BUILD/venv, a venv
# over Debian's python3 with its site packages (python3-torch, numpy, cffi,
# pytest come from Debian through scripts/deps.sh), plus what
# tests/python-requirements.txt asks from PyPI. Re-installs only when that
# file changed since the last run.
set -eu
BUILD=${BUILD:-build}
venv="$BUILD/venv"
req=tests/python-requirements.txt
if [ ! -x "$venv/bin/python" ]; then
    echo "graft: making $venv (Debian's python3 with its packages)"
    /usr/bin/python3 -m venv --system-site-packages "$venv"
fi
stamp="$venv/.requirements"
if [ -s "$req" ] && ! cmp -s "$req" "$stamp"; then
    echo "graft: installing $req into $venv"
    "$venv/bin/python" -m pip install -q --disable-pip-version-check -r "$req" </dev/null
    cp "$req" "$stamp"
fi
