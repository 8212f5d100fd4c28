#!/usr/bin/env bash
# Scaling runs for a machine with many cores (the 16-core device machine):
# more members and more senders on shm, and failover with more members.
#
#   bench/run-scaling.sh [SPINDLE_BINARY] [OUT_DIR]
#
# Each run writes JSON (with the machine noted) into OUT_DIR. Bounded: each
# command runs under `timeout`.
set -euo pipefail
BIN=${1:-target/release/spindle}
OUT=${2:-bench/results}
mkdir -p "$OUT"
nproc
for members in 2 4 8 12 16; do
    for senders in one all; do
        [[ $senders == one ]] && count=400000 || count=$((1600000 / members))
        timeout 300 "$BIN" bench multicast --members "$members" --senders "$senders" --size 1024 \
            --count "$count" --idle backoff --no-baseline \
            --json "$OUT/scaling-1k-${members}m-${senders}.json" 2>&1 | grep -E "slowest" || true
    done
done
timeout 300 "$BIN" bench multicast --members 2 --senders one --size 10240 --count 500000 --idle spin --pin \
    --json "$OUT/scaling-10k-2m-one.json" 2>&1 | grep -E "slowest|ratio" || true
for members in 3 8 16; do
    timeout 300 "$BIN" bench failover --members "$members" --fault kill --runs 10 \
        --json "$OUT/scaling-failover-${members}m-kill.json" 2>&1 | grep -E "^failover" || true
done
