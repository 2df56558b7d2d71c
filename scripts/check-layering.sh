#!/bin/sh
# Checks the dependency order of docs/ARCHITECTURE.md twice: in the sources
# (which headers each module includes) and in the objects (which graft
# symbols each module's objects need). Exits non-zero on any violation.
#   common < etcd < membership < runtime
#   common < transfer, persist < runtime
#   runtime < sim, tools, examples, bench
#   the embedded etcd launcher (tools/etcd_launcher/): above etcd, outside the library
set -u
build=${1:-build}
bad=0

# module -> the modules whose headers (their folder's and their public
# one) and symbols it must not use
forbid() {
    case "$1" in
    common) echo "etcd membership transfer persist runtime" ;;
    etcd) echo "membership transfer persist runtime" ;;
    membership) echo "transfer persist runtime" ;;
    transfer) echo "etcd membership persist runtime" ;;
    persist) echo "etcd membership transfer runtime" ;;
    *) echo "" ;;
    esac
}
# module -> its public header in include/graft/ (with the parts it
# includes: graft.h's graft_config.h and graft_observe.h)
pubhdr() {
    case "$1" in
    runtime) echo "graft" ;;
    *) echo "$1" ;;
    esac
}
# module -> the symbol prefixes (a grep -E alternation) of its functions
symprefix() {
    case "$1" in
    etcd) echo "graft_etcd_|graft__etcd_" ;;
    membership) echo "graft_membership_" ;;
    transfer) echo "graft_transfer_" ;;
    persist) echo "graft_persist_" ;;
    runtime) echo "graft_runtime_" ;;
    esac
}

for m in common etcd membership transfer persist; do
    for other in $(forbid $m); do
        if grep -ln "#include *\"$other/" $m/*.c $m/*.h 2>/dev/null; then
            echo "layering: $m/ includes a header of $other/" >&2
            bad=1
        fi
        h=$(pubhdr $other)
        if grep -ln "#include *[<\"]graft/$h\(_[a-z]*\)\?\.h[>\"]" $m/*.c $m/*.h 2>/dev/null; then
            echo "layering: $m/ includes graft/$h.h" >&2
            bad=1
        fi
        p=$(symprefix $other)
        for o in "$build"/obj/$m/*.o; do
            [ -f "$o" ] || continue
            if nm -u "$o" | grep -Eq " ($p)"; then
                echo "layering: $o needs $(nm -u "$o" | grep -E " ($p)" | head -1 | awk '{print $2}') from $other/" >&2
                bad=1
            fi
        done
    done
done

# The embedded etcd launcher (tools/etcd_launcher/) is not part of the
# library: no module includes its header or needs its symbols. It sits on
# libgraft.a's common/ and etcd/ internals, and on nothing above them.
for m in common etcd membership transfer persist runtime; do
    if grep -ln "etcd_launcher\.h" $m/*.c $m/*.h 2>/dev/null; then
        echo "layering: $m/ includes the etcd launcher's header" >&2
        bad=1
    fi
    for o in "$build"/obj/$m/*.o; do
        [ -f "$o" ] || continue
        if nm -u "$o" | grep -Eq " graft_etcd_(server|cluster)_"; then
            echo "layering: $o needs the etcd launcher ($(nm -u "$o" | grep -E " graft_etcd_(server|cluster)_" | head -1 | awk '{print $2}'))" >&2
            bad=1
        fi
    done
done
if grep -rln --include='*.c' --include='*.h' '#include *"\(membership\|transfer\|persist\|runtime\)/\|#include *<graft/\(membership\|transfer\|persist\|graft\)\.h>' tools/etcd_launcher 2>/dev/null; then
    echo "layering: tools/etcd_launcher/ uses a module above etcd/" >&2
    bad=1
fi

# Users of the library see public headers only (and the launcher's).
for d in sim tools examples bench python; do
    [ -d "$d" ] || continue
    if grep -rln --exclude-dir=etcd_launcher --include='*.c' --include='*.h' 'graft_internal\.h\|#include *"\(common\|etcd\|membership\|transfer\|persist\|runtime\)/' "$d" 2>/dev/null; then
        echo "layering: $d/ uses internal headers" >&2
        bad=1
    fi
done

if [ $bad -eq 0 ]; then
    echo "layering: ok (common < etcd < membership < runtime; common < transfer, persist < runtime; runtime < sim, tools; etcd < etcd launcher, outside the library)"
fi
exit $bad
