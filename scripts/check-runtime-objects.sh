#!/bin/sh
# The runtime's objects (docs/ARCHITECTURE.md, "The runtime's objects"),
# checked in its compiled objects and its sources:
#   - a part calls only parts; an object calls only parts, never another
#     object nor the coordinator; only the coordinator calls objects;
#   - the state an object owns (the fields below) is touched only by the
#     object's files and the coordinator's.
# With --dot FILE it writes the picture of what it found, which
# docs/runtime-objects.svg is drawn from (scripts/runtime-objects-svg.sh);
# without, it checks that docs/runtime-objects.dot is that picture still.
# Usage: check-runtime-objects.sh BUILD [--dot FILE]. Exits non-zero on a
# violation or a stale picture.
set -u
build=${1:-build}
dot=""
[ "${2:-}" = "--dot" ] && dot=${3:?--dot needs a file}
obj="$build/obj/runtime"
[ -d "$obj" ] || { echo "runtime objects: no $obj (build first)" >&2; exit 2; }

# file (without .c) -> "floor object"
unit_of() {
    case "$1" in
    runtime | runtime_step | runtime_step_heal | runtime_join) echo "coordinator step" ;;
    runtime_heal) echo "object heal" ;;
    runtime_serve | runtime_nccl) echo "object serve" ;;
    runtime_persist) echo "object tier" ;;
    runtime_steady) echo "object steady" ;;
    runtime_delegate) echo "object delegate" ;;
    runtime_drift) echo "object drift" ;;
    runtime_finish) echo "object finish" ;;
    runtime_follow) echo "object follow" ;;
    runtime_secret) echo "object secret" ;;
    runtime_channel) echo "part channel" ;;
    runtime_stepmsg) echo "part stepmsg" ;;
    steady_logic) echo "part steady_logic" ;;
    runtime_records) echo "part records" ;;
    runtime_observe) echo "part observe" ;;
    runtime_fanout) echo "part fanout" ;;
    runtime_nccl_pair) echo "part nccl_pair" ;;
    runtime_blob) echo "part blob" ;;
    runtime_skip) echo "part test_hook" ;;
    config) echo "part config" ;;
    *) echo "unknown $1" ;;
    esac
}

# object -> the runtime's fields it owns (rt->FIELD; a struct of its own
# for the heal, the serve and the tier: graft__rt_heal_t ...)
fields_of() {
    case "$1" in
    heal) echo "heal" ;;
    serve) echo "serve" ;;
    tier) echo "tier" ;;
    steady) echo "steady" ;;
    finish) echo "n_finished finished_step" ;;
    follow) echo "follow" ;;
    test_hook) echo "test_hook" ;;
    esac
}

bad=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# symbol -> unit, from what each object file defines
for o in "$obj"/*.o; do
    f=$(basename "$o" .o)
    set -- $(unit_of "$f")
    if [ "$1" = unknown ]; then
        echo "runtime objects: runtime/$f.c is in no unit: add it to $0" >&2
        bad=1
        continue
    fi
    nm --defined-only "$o" | awk -v u="$1 $2" '$2 ~ /^[TDBR]$/ {print $3, u}' >>"$tmp/defs"
done
# calls between units
for o in "$obj"/*.o; do
    f=$(basename "$o" .o)
    from=$(unit_of "$f")
    nm -u "$o" | awk '{print $2}' | sort -u >"$tmp/undef"
    awk 'NR == FNR {want[$1] = 1; next} ($1 in want) {print $2, $3}' "$tmp/undef" "$tmp/defs" |
        sort -u | while read -r floor unit; do
        set -- $from
        [ "$2" = "$unit" ] && continue
        echo "$2 $unit $1 $floor $f" >>"$tmp/edges"
    done
done
touch "$tmp/edges"
while read -r a b fa fb f; do
    case "$fa>$fb" in
    "part>part" | "object>part" | "coordinator>"*) ;;
    *)
        echo "runtime objects: runtime/$f.c ($fa $a) calls $fb $b" >&2
        bad=1
        ;;
    esac
done <"$tmp/edges"

# owned fields touched by another unit's files
for src in runtime/*.c; do
    f=$(basename "$src" .c)
    set -- $(unit_of "$f")
    [ "$1" = coordinator ] && continue
    mine=$2
    for owner in heal serve tier steady finish test_hook; do
        [ "$owner" = "$mine" ] && continue
        for fld in $(fields_of "$owner"); do
            if grep -q "rt->$fld\b" "$src"; then
                echo "runtime objects: $src touches rt->$fld, which $owner owns" >&2
                bad=1
            fi
        done
    done
done

out=${dot:-$tmp/picture.dot}
{
    echo "digraph runtime {"
    echo "  rankdir=TB; node [shape=box, fontname=\"Helvetica\", fontsize=10];"
    echo "  edge [color=\"#555555\"];"
    for floor in coordinator object part; do
        echo "  subgraph cluster_$floor { label=\"$floor\"; style=dashed;"
        awk -v fl="$floor" '$2 == fl {print $3}' "$tmp/defs" | sort -u | while read -r u; do
            files=$(for o in "$obj"/*.o; do
                g=$(basename "$o" .o)
                [ "$(unit_of "$g" | cut -d' ' -f2)" = "$u" ] && printf '%s.c\\n' "$g"
            done)
            owns=$(for fld in $(fields_of "$u"); do printf 'rt->%s ' "$fld"; done)
            [ -n "$owns" ] && owns="owns: ${owns% }\\n"
            printf '    "%s" [label="%s\\n%s%s"];\n' "$u" "$u" "$files" "$owns"
        done
        echo "  }"
    done
    awk '{print "  \"" $1 "\" -> \"" $2 "\";"}' "$tmp/edges" | sort -u
    echo "}"
} >"$out"
if [ -z "$dot" ] && ! cmp -s "$out" docs/runtime-objects.dot; then
    echo "runtime objects: docs/runtime-objects.dot is not what the build shows:" >&2
    diff docs/runtime-objects.dot "$out" >&2
    echo "redraw it: sh scripts/runtime-objects-svg.sh $build" >&2
    bad=1
fi

if [ $bad -eq 0 ]; then
    echo "runtime objects: ok (coordinator > objects > parts; no object calls another)"
fi
exit $bad
