#!/bin/sh
# Remakes the dashboard's two screenshots in docs/img (docs/OPERATIONS.md):
# dashboard-during-kill.png (a live graft-sim run, group 1 down after the
# schedule's kill) and dashboard-finished.png (the same job once the run
# ended). They are taken by the headless-Chromium tests of tests/dashboard
# (GRAFT_DASHBOARD_SHOTS names the folder), so the pictures are of a page
# those tests checked. Needs what `make check` needs: a build in $BUILD
# (default build: make all) and its venv (scripts/python-env.sh).
set -eu
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
PYTHON=${PYTHON:-$BUILD/venv/bin/python}
out=$(pwd)/docs/img
mkdir -p "$out"
[ -x "$BUILD/bin/graft-sim" ] && [ -x "$BUILD/bin/graftctl" ] ||
    { echo "dashboard-screenshots: build first (make BUILD=$BUILD all)" >&2; exit 1; }
# Slower steps (60 ms): the kill comes 12 s after the hang, so the page
# test, busy with its checks after the hang's recovery, is back in time to
# catch group 1 down after the kill.
BUILD=$BUILD GRAFT_SIM_STEP_MS=${GRAFT_SIM_STEP_MS:-60} GRAFT_DASHBOARD_SHOTS=$out "$PYTHON" -m pytest -q -p no:cacheprovider \
    tests/dashboard/test_dashboard.py -k "follows_a_group or finished_job"
for f in dashboard-during-kill.png dashboard-finished.png; do
    size=$(stat -c %s "$out/$f")
    echo "$out/$f: $size bytes"
    [ "$size" -lt 307200 ] || { echo "dashboard-screenshots: $f is over 300 KB" >&2; exit 1; }
done
