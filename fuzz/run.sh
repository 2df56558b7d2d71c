#!/bin/sh
# Runs each libFuzzer harness given for FUZZ_SECONDS, one at a time, on its
# committed seed corpus (fuzz/corpus/<harness>/, read only) plus a working
# corpus under $FUZZ_BUILD/corpus/. Fails at the first finding (a crash, a
# leak, a timeout or a sanitizer report); the input is left under
# $FUZZ_BUILD/artifacts/ and its path printed. Prints each harness's
# executions for docs/FUZZING.md.
set -eu

: "${FUZZ_BUILD:?}"
: "${FUZZ_SECONDS:=30}"
[ $# -gt 0 ] || { echo "fuzz: no harness selected" >&2; exit 1; }

status=0
for prog in "$@"; do
    name=$(basename "$prog")
    seeds="fuzz/corpus/$name"
    work="$FUZZ_BUILD/corpus/$name"
    arts="$FUZZ_BUILD/artifacts/$name/"
    log="$FUZZ_BUILD/logs/$name.log"
    mkdir -p "$work" "$arts" "$(dirname "$log")"
    [ -d "$seeds" ] || { echo "fuzz: $name has no seed corpus $seeds" >&2; exit 1; }
    printf 'fuzz: %-18s %ss ... ' "$name" "$FUZZ_SECONDS"
    if "$prog" -max_total_time="$FUZZ_SECONDS" -timeout=10 -rss_limit_mb=2048 \
        -print_final_stats=1 -artifact_prefix="$arts" "$work" "$seeds" >"$log" 2>&1; then
        runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
        echo "ok, ${runs:-?} executions"
    else
        echo "FINDING (log: $log)"
        grep -E '^(==[0-9]+==ERROR|SUMMARY|artifact_prefix|Test unit written)' "$log" || tail -n 30 "$log"
        status=1
        break
    fi
done
exit $status
