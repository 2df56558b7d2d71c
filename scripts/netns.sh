#!/bin/sh
# netns.sh: network namespaces joined by shaped veth links, for benchmarks and
# the simulator's --netns mode (docs/TRANSFER.md, docs/SIM.md).
#
#   netns.sh up NAME K [RATE]   namespaces NAME-0 .. NAME-K (RATE default 1gbit)
#   netns.sh down NAME          remove them (idempotent)
#   netns.sh exec NAME I cmd... run cmd in namespace NAME-I
#   netns.sh addr I             the address of namespace I (10.77.0.<I+1>)
#
# Layout: a star. NAME-0 is the hub: it holds a bridge "br0" with address
# 10.77.0.1/24 (the recipient's side). Each NAME-i (1..K) has "eth0"
# (10.77.0.<i+1>/24) whose veth peer "p<i>" is a port of the bridge in NAME-0.
# A bridge rather than one veth per pair so that every namespace reaches
# every other one (the simulator's groups pull from each other); each link
# is shaped in both directions with a token bucket (tbf) at RATE: on eth0
# (what NAME-i sends) and on p<i> (what NAME-i receives). The hub's own
# address is on the bridge and is not shaped, so K donors can together
# deliver K x RATE to it. Every device lives inside the namespaces, none in
# the caller's: deleting the namespaces removes everything.
#
# Needs root and iproute2's "ip netns": otherwise exit status 2 with a
# message (callers report "skipped").
set -u

usage() {
    echo "usage: $0 up NAME K [RATE] | down NAME | exec NAME I cmd... | addr I" >&2
    exit 2
}

need_root() {
    if [ "$(id -u)" != 0 ]; then
        echo "netns.sh: needs root for network namespaces" >&2
        exit 2
    fi
    if ! command -v ip >/dev/null 2>&1 || ! ip netns list >/dev/null 2>&1; then
        echo "netns.sh: 'ip netns' is unavailable" >&2
        exit 2
    fi
}

check_name() {
    case "$1" in
    '' | *[!A-Za-z0-9_]*) echo "netns.sh: bad name '$1' (letters, digits, _)" >&2; exit 2 ;;
    esac
}

check_index() {
    case "$1" in
    '' | *[!0-9]*) echo "netns.sh: bad index '$1'" >&2; exit 2 ;;
    esac
    if [ "$1" -gt 250 ]; then
        echo "netns.sh: index $1 out of range (0..250)" >&2
        exit 2
    fi
}

down() {
    # Every namespace called NAME-<digits>; deleting one removes its veths
    # (and so their peers in the hub).
    for ns in $(ip netns list 2>/dev/null | awk '{print $1}'); do
        case "$ns" in
        "$1"-*)
            rest=${ns#"$1"-}
            case "$rest" in '' | *[!0-9]*) continue ;; esac
            ip netns delete "$ns" 2>/dev/null || true
            ;;
        esac
    done
    return 0
}

up() {
    name=$1 k=$2 rate=$3
    hub="$name-0"
    down "$name"
    # On any failure below, leave nothing behind.
    trap 'down "$name"; exit 1' EXIT INT TERM HUP
    set -e
    ip netns add "$hub"
    ip -n "$hub" link set lo up
    ip -n "$hub" link add br0 type bridge
    ip -n "$hub" addr add 10.77.0.1/24 dev br0
    ip -n "$hub" link set br0 up
    i=1
    while [ "$i" -le "$k" ]; do
        ns="$name-$i"
        ip netns add "$ns"
        ip -n "$ns" link set lo up
        ip -n "$hub" link add "p$i" type veth peer name eth0 netns "$ns"
        ip -n "$hub" link set "p$i" master br0
        ip -n "$hub" link set "p$i" up
        ip -n "$ns" addr add "10.77.0.$((i + 1))/24" dev eth0
        ip -n "$ns" link set eth0 up
        # burst: at least one GSO packet (64 KiB) and a few ms at RATE.
        ip netns exec "$ns" tc qdisc add dev eth0 root tbf rate "$rate" burst 1mb latency 50ms
        ip netns exec "$hub" tc qdisc add dev "p$i" root tbf rate "$rate" burst 1mb latency 50ms
        i=$((i + 1))
    done
    set +e
    trap - EXIT INT TERM HUP
    return 0
}

[ $# -ge 1 ] || usage
cmd=$1
shift
case "$cmd" in
up)
    [ $# -ge 2 ] && [ $# -le 3 ] || usage
    check_name "$1"
    check_index "$2"
    [ "$2" -ge 1 ] || { echo "netns.sh: K must be >= 1" >&2; exit 2; }
    need_root
    up "$1" "$2" "${3:-1gbit}"
    ;;
down)
    [ $# -eq 1 ] || usage
    check_name "$1"
    need_root
    down "$1"
    ;;
exec)
    [ $# -ge 3 ] || usage
    check_name "$1"
    check_index "$2"
    need_root
    ns="$1-$2"
    shift 2
    exec ip netns exec "$ns" "$@"
    ;;
addr)
    [ $# -eq 1 ] || usage
    check_index "$1"
    echo "10.77.0.$(($1 + 1))"
    ;;
*)
    usage
    ;;
esac
