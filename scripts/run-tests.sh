#!/bin/sh
# Runs every test program given on the command line, reading cmocka's TAP
# output, and ends with one line: "N passed, N failed".
# A skipped test (e.g. "skipped: no GPU") is counted apart, never as passed.
# A program that crashes or times out counts as one more failure.
#
# Environment: TEST_TIMEOUT (seconds per program, default 600), SAN=1 when
# the programs were built with sanitizers, TSAN=1 with ThreadSanitizer, TESTS_FILTER (substring of the
# program name to run only some), PYTEST_DIRS (folders of pytest suites,
# run after the programs with $PYTHON, default build/venv/bin/python; each
# pytest test counts as one test in the total).
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
# UCX prints its warnings on stdout unless told otherwise, in the middle
# of the lines that trainers print there and tests read ("final step ...").
export UCX_LOG_FILE="${UCX_LOG_FILE:-stderr}"
# UCX's malloc/mmap hooks fight the sanitizers' interceptors.
if [ "${SAN:-0}" = 1 ]; then
    export UCX_MEM_MALLOC_HOOKS=no UCX_MEM_MMAP_HOOK_MODE=none
    export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0:protect_shadow_gap=0}"
    # Leaks inside UCX that graft cannot free (each explained in the file).
    export LSAN_OPTIONS="${LSAN_OPTIONS:-suppressions=$(cd "$(dirname "$0")/.." && pwd)/tests/lsan.supp:print_suppressions=0}"
    export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
fi
if [ "${TSAN:-0}" = 1 ]; then
    export UCX_MEM_MALLOC_HOOKS=no UCX_MEM_MMAP_HOOK_MODE=none UCX_MEM_EVENTS=no
    export TSAN_OPTIONS="${TSAN_OPTIONS:-halt_on_error=1 allocator_may_return_null=1 second_deadlock_stack=1}"
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

# pytest suites: one junit report per folder, its test cases counted like
# cmocka's (a skipped case apart, an error as a failure).
PYTHON=${PYTHON:-${BUILD:-build}/venv/bin/python}
for dir in ${PYTEST_DIRS:-}; do
    name="pytest:$dir"
    if [ -n "${TESTS_FILTER:-}" ] && ! echo "$name" | grep -q "$TESTS_FILTER"; then
        continue
    fi
    log="$logdir/pytest.$(echo "$dir" | tr / _).log"
    xml="$log.xml"
    start=$(date +%s)
    timeout -k 10 "$timeout_s" "$PYTHON" -m pytest -q -p no:cacheprovider \
        --junitxml="$xml" "$dir" </dev/null >"$log" 2>&1
    rc=$?
    secs=$(( $(date +%s) - start ))
    counts=$("$PYTHON" - "$xml" <<'PY' 2>/dev/null
import sys, xml.etree.ElementTree as ET
p = f = s = 0
for case in ET.parse(sys.argv[1]).getroot().iter("testcase"):
    kinds = {c.tag for c in case}
    if "skipped" in kinds: s += 1
    elif kinds & {"failure", "error"}: f += 1
    else: p += 1
print(p, f, s)
PY
)
    [ -n "$counts" ] || counts="0 0 0"
    set -- $counts
    p=$1 f=$2 s=$3
    status="ok"
    if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then
        f=$((f + 1))
        if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then status="TIMED OUT after ${timeout_s}s"
        else status="FAILED (pytest exit $rc)"; fi
    elif [ "$f" -ne 0 ]; then
        status="FAILED"
    fi
    passed=$((passed + p))
    failed=$((failed + f))
    skipped=$((skipped + s))
    printf '%-28s %3d passed %3d failed %3d skipped  %4ds  %s\n' "$name" "$p" "$f" "$s" "$secs" "$status"
    if [ "$status" != ok ]; then
        failures="$failures $name"
        echo "---- last lines of $name ----"
        tail -n 120 "$log"
        echo "---- end of $name ----"
    fi
done

[ -n "$failures" ] && echo "failing programs:$failures"
echo "$skipped skipped"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
