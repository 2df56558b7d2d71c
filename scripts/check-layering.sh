#!/bin/sh
# Checks the dependency order of docs/ARCHITECTURE.md twice: in the sources
# (which headers each module includes) and in the objects (which graft
# symbols each module's objects need). Exits non-zero on any violation.
set -u
build=${1:-build}
bad=0

# module -> public headers and symbol prefixes it must not use
forbid() {
    case "$1" in
    common) echo "etcd membership transfer persist graft" ;;
    membership) echo "transfer persist graft" ;;
    transfer) echo "etcd membership persist graft" ;;
    persist) echo "etcd membership transfer graft" ;;
    *) echo "" ;;
    esac
}
symprefix() {
    case "$1" in
    etcd) echo "graft_etcd_" ;;
    membership) echo "graft_membership_" ;;
    transfer) echo "graft_transfer_" ;;
    persist) echo "graft_persist_" ;;
    graft) echo "graft_runtime_" ;;
    esac
}

for m in common membership transfer persist; do
    for other in membership transfer persist runtime; do
        [ "$other" = "$m" ] && continue
        if grep -ln "#include *\"$other/" $m/*.c $m/*.h 2>/dev/null; then
            echo "layering: $m/ includes a header of $other/" >&2
            bad=1
        fi
    done
    for h in $(forbid $m); do
        if grep -ln "#include *[<\"]graft/$h\.h[>\"]" $m/*.c $m/*.h 2>/dev/null; then
            echo "layering: $m/ includes graft/$h.h" >&2
            bad=1
        fi
        p=$(symprefix $h)
        [ -z "$p" ] && continue
        for o in "$build"/obj/$m/*.o; do
            [ -f "$o" ] || continue
            if nm -u "$o" | grep -q " $p"; then
                echo "layering: $o needs $(nm -u "$o" | grep " $p" | head -1 | awk '{print $2}') from another module" >&2
                bad=1
            fi
        done
    done
done

# Users of the library see public headers only.
for d in sim tools examples bench python; do
    [ -d "$d" ] || continue
    if grep -rln --include='*.c' --include='*.h' 'graft_internal\.h\|#include *"\(common\|membership\|transfer\|persist\|runtime\)/' "$d" 2>/dev/null; then
        echo "layering: $d/ uses internal headers" >&2
        bad=1
    fi
done

if [ $bad -eq 0 ]; then
    echo "layering: ok (common < membership, transfer, persist < runtime < sim, tools)"
fi
exit $bad
