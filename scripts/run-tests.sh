#!/bin/sh
# Runs every test program given on the command line, reading cmocka's TAP
# output, and ends with one line: "N passed, N failed".
# A skipped test (e.g. "skipped: no GPU") is counted apart, never as passed.
# A program that crashes or times out counts as one more failure.
#
# Environment: TEST_TIMEOUT (seconds per program, default 600), SAN=1 when
# the programs were built with sanitizers, TESTS_FILTER (substring of the
# program name to run only some).
set -u

timeout_s=${TEST_TIMEOUT:-600}
passed=0
failed=0
skipped=0
failures=""

export CMOCKA_MESSAGE_OUTPUT=TAP
# Test traffic stays on loopback: UCX's tcp transport would otherwise also
# use every other interface of the machine (and fail when one comes or goes
# while a test runs). Tests that build their own namespaces set their own.
export UCX_NET_DEVICES="${UCX_NET_DEVICES:-lo}"
# UCX's malloc/mmap hooks fight the sanitizers' interceptors.
if [ "${SAN:-0}" = 1 ]; then
    export UCX_MEM_MALLOC_HOOKS=no UCX_MEM_MMAP_HOOK_MODE=none
    export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0:protect_shadow_gap=0}"
    export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
fi

logdir=$(mktemp -d "${TMPDIR:-/tmp}/graft-tests.XXXXXX")
trap 'rm -rf "$logdir"' EXIT

for prog in "$@"; do
    name=$(basename "$prog")
    if [ -n "${TESTS_FILTER:-}" ] && ! echo "$name" | grep -q "$TESTS_FILTER"; then
        continue
    fi
    log="$logdir/$name.log"
    start=$(date +%s)
    timeout -k 10 "$timeout_s" "$prog" </dev/null >"$log" 2>&1
    rc=$?
    secs=$(( $(date +%s) - start ))
    # cmocka 1.1.5 writes a skip as "not ok N # SKIP name", older ones as "ok".
    p=$(grep -c '^ok ' "$log" | tr -d ' ')
    sp=$(grep -E '^ok .*# (SKIP|skip)' "$log" | wc -l | tr -d ' ')
    sf=$(grep -E '^not ok .*# (SKIP|skip)' "$log" | wc -l | tr -d ' ')
    f=$(grep -c '^not ok ' "$log" | tr -d ' ')
    s=$((sp + sf))
    p=$((p - sp))
    f=$((f - sf))
    status="ok"
    if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then
        f=$((f + 1))
        if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then status="TIMED OUT after ${timeout_s}s"
        else status="CRASHED (exit $rc)"; fi
    elif [ "$f" -ne 0 ]; then
        status="FAILED"
    fi
    passed=$((passed + p))
    failed=$((failed + f))
    skipped=$((skipped + s))
    printf '%-28s %3d passed %3d failed %3d skipped  %4ds  %s\n' "$name" "$p" "$f" "$s" "$secs" "$status"
    grep -E '^(not )?ok .*# (SKIP|skip)' "$log" | sed 's/^/    /'
    if [ "$status" != ok ]; then
        failures="$failures $name"
        echo "---- output of $name ----"
        # Each failed test with the lines cmocka printed before it (the
        # assertion), then the end of the log.
        grep -v -E '^not ok .*# (SKIP|skip)' "$log" | grep -B 12 -E '^not ok ' | head -n 200
        echo "---- last lines of $name ----"
        tail -n 80 "$log"
        echo "---- end of $name ----"
    fi
done

[ -n "$failures" ] && echo "failing programs:$failures"
echo "$skipped skipped"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
