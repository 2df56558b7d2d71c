#!/bin/sh
# What `make demo` runs: graft-sim run with a default scenario on this
# machine. 4 replica groups x 2 ranks of the example trainer
# (build/bin/train_mlp) train through the real runtime, an embedded etcd
# and UCX on loopback while about 20 failures of every kind are injected
# (rank and group kills, a donor killed while it serves, hangs, etcd
# restarts and a disaster that must restore from disk). The simulator
# prints a live progress line, then the report; the verdict says whether
# the final state is bit-exact with a fault-free run.
#
# Environment: BUILD (default build), SEED (default 1), STEPS (600),
# FAILURES (20), GROUPS_N (4), RANKS (2), OUT (report directory, default
# $BUILD/demo). Extra arguments go to graft-sim run.
set -eu
BUILD=${BUILD:-build}
SEED=${SEED:-1}
STEPS=${STEPS:-600}
FAILURES=${FAILURES:-20}
GROUPS_N=${GROUPS_N:-4}
RANKS=${RANKS:-2}
OUT=${OUT:-$BUILD/demo}
for b in graft-sim train_mlp; do
    if [ ! -x "$BUILD/bin/$b" ]; then
        echo "demo: $BUILD/bin/$b is not built (run make)" >&2
        exit 1
    fi
done
mkdir -p "$OUT"
echo "graft demo: $GROUPS_N groups x $RANKS ranks, $STEPS steps, $FAILURES failures (seed $SEED)"
status=0
"$BUILD/bin/graft-sim" run --groups "$GROUPS_N" --ranks "$RANKS" --steps "$STEPS" \
    --seed "$SEED" --random-failures "$FAILURES" --mode strict \
    --json "$OUT/report.json" --plot "$OUT/timeline.svg" "$@" || status=$?
echo
echo "report: $OUT/report.json   timeline and recovery-time plot: $OUT/timeline.svg"
exit $status
