#!/usr/bin/env bash
# Time-driven channels and the global clock across 3 network namespaces on
# one machine, as if on 3 hosts: each namespace has its own network stack,
# joined to the others by a veth pair on a private bridge; the members use
# the tcp fabric (`spindle rt … --transport tcp --netns …`).
#
#   ns 0 (10.X.Y.1) ─veth─┐
#   ns 1 (10.X.Y.2) ─veth─┼─ bridge
#   ns 2 (10.X.Y.3) ─veth─┘
#
# 1. `spindle rt clock` across the namespaces: error against the true
#    (injected) time and the reported bound; true time outside the bound
#    must be 0.
# 2. `spindle rt ring` across the namespaces (default 5,000 periods).
#
# Results: bench/results/rt-clock-netns.{json,txt,svg} and
# bench/results/rt-ring-netns.{json,txt,svg} (or --results DIR, --tag T
# for rt-*-netns-T.*). Everything it creates (namespaces, veths, bridge,
# files) is removed on exit, however it exits; every step is bounded by
# `timeout`. Needs root and iproute2.
#
# usage: scripts/rt-netns.sh [--bin PATH] [--periods N] [--deadline-us D] [--clock-s S]
#                            [--results DIR] [--tag T] [--quick] [--only clock|ring]
#                            [-- extra ring args]
set -euo pipefail
cd "$(dirname "$0")/.."

BIN=${SPINDLE_BIN:-}
PERIODS=5000
CLOCK_S=10
DEADLINE_US=6500
RESULTS=bench/results
TAG=
ONLY=
EXTRA=()
while [[ $# -gt 0 ]]; do
    case "$1" in
        --bin) BIN=$2; shift 2 ;;
        --periods) PERIODS=$2; shift 2 ;;
        --deadline-us) DEADLINE_US=$2; shift 2 ;;
        --clock-s) CLOCK_S=$2; shift 2 ;;
        --results) RESULTS=$2; shift 2 ;;
        --tag) TAG="-$2"; shift 2 ;;
        --quick) PERIODS=200; CLOCK_S=3; shift ;;
        --only) ONLY=$2; shift 2 ;;
        --) shift; EXTRA=("$@"); break ;;
        *) echo "unknown argument $1" >&2; exit 2 ;;
    esac
done
if [[ -z "$BIN" ]]; then
    for b in "${CARGO_TARGET_DIR:-target}/release/spindle" target/release/spindle; do
        [[ -x "$b" ]] && BIN=$(realpath "$b") && break
    done
fi
[[ -x "$BIN" ]] || { echo "spindle binary not found: build it (cargo build --release -p spindle-cli) or pass --bin" >&2; exit 2; }
[[ $(id -u) -eq 0 ]] || { echo "needs root (network namespaces)" >&2; exit 2; }
command -v ip >/dev/null || { echo "needs iproute2 (ip)" >&2; exit 2; }
mkdir -p "$RESULTS"

ID=$$
NET="10.$((200 + ID % 50)).$((ID / 50 % 250)).0"
PREFIX=${NET%.0}
BR="sprt$ID"
NS=("sprt$ID-0" "sprt$ID-1" "sprt$ID-2")

cleanup() {
    set +e
    for i in 0 1 2; do
        ip netns del "${NS[$i]}" 2>/dev/null
        ip link del "sprtv$ID-$i" 2>/dev/null
    done
    ip link del "$BR" 2>/dev/null
}
trap cleanup EXIT INT TERM

ip link add "$BR" type bridge
ip link set "$BR" up
for i in 0 1 2; do
    ip netns add "${NS[$i]}"
    ip link add "sprtv$ID-$i" type veth peer name "eth$i" netns "${NS[$i]}"
    ip link set "sprtv$ID-$i" master "$BR" up
    ip -n "${NS[$i]}" addr add "$PREFIX.$((i + 1))/24" dev "eth$i"
    ip -n "${NS[$i]}" link set "eth$i" up
    ip -n "${NS[$i]}" link set lo up
done
# Wait for the bridge to forward (bounded): ns 0 reaches ns 1 and ns 2.
for _ in $(seq 1 50); do
    if ip netns exec "${NS[0]}" ping -c1 -W1 "$PREFIX.2" >/dev/null 2>&1 \
        && ip netns exec "${NS[0]}" ping -c1 -W1 "$PREFIX.3" >/dev/null 2>&1; then
        break
    fi
    sleep 0.2
done

NETNS="${NS[0]},${NS[1]},${NS[2]}"
addresses() { # port
    echo "$PREFIX.1:$1,$PREFIX.2:$1,$PREFIX.3:$1"
}
run() { # name, seconds, args...
    local name=$1 limit=$2; shift 2
    echo "== spindle rt $* (members in namespaces $NETNS)" | tee "$RESULTS/$name.txt"
    timeout "$limit" "$BIN" rt "$@" --transport tcp --netns "$NETNS" \
        --json "$RESULTS/$name.json" --plot "$RESULTS/$name.svg" 2>&1 | tee -a "$RESULTS/$name.txt"
    return "${PIPESTATUS[0]}"
}

if [[ "$ONLY" != ring ]]; then
echo "== 1. global clock across 3 namespaces ($PREFIX.1-3)"
run "rt-clock-netns$TAG" $((CLOCK_S + 120)) clock --duration-s "$CLOCK_S" --addresses "$(addresses 7300)"
outside=$(sed -n 's/.*"outside_bound": \([0-9]*\).*/\1/p' "$RESULTS/rt-clock-netns$TAG.json" | head -1)
if [[ "$outside" != "0" ]]; then
    echo "FAIL: true time outside the reported bound in $outside samples"; exit 1
fi
echo "OK: the true time stayed inside the reported interval in every sample"
fi
[[ "$ONLY" == clock ]] && exit 0

echo "== 2. the ring across 3 namespaces, $PERIODS periods"
# The clock budget covers the exchanges' round trip through two network
# stacks; deadlines as on shm (this VM stalls every thread for up to ~5 ms).
run "rt-ring-netns$TAG" $((PERIODS / 10 + 300)) ring --periods "$PERIODS" --deadline-us "$DEADLINE_US" \
    --clock-budget-us 200 --addresses "$(addresses 7310)" "${EXTRA[@]}"
echo "OK: results in $RESULTS/rt-clock-netns$TAG.* and $RESULTS/rt-ring-netns$TAG.*"
