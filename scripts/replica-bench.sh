#!/usr/bin/env bash
# Reproduce the replica figures of bench/RESULTS-replica.md:
#   1. write latency, one-sided vs rpc, on shm and tcp (loopback) in one
#      run, plus the KV service's failover time (JSON, SVG, text);
#   2. the KV service against redis-server with redis-benchmark (members
#      on shm and on tcp).
#
#   scripts/replica-bench.sh [FAILOVER_TRIALS]     (default 10)
#
# Release build in $CARGO_TARGET_DIR (default target/). Step 2 installs
# redis-server and redis-tools from apt when missing (see
# bench/peers/redis-compare.sh). Everything listens on 127.0.0.1 only.
set -euo pipefail
cd "$(dirname "$0")/.."
TRIALS=${1:-10}
case "$TRIALS" in
    ''|*[!0-9]*) echo "replica-bench.sh: FAILOVER_TRIALS '$TRIALS' is not a number" >&2; exit 2 ;;
esac
cargo build --release -q -p spindle-cli
bin=${CARGO_TARGET_DIR:-target}/release/spindle
"$bin" bench replica --failover "$TRIALS" \
    --json bench/results/replica-shm-tcp.json --plot bench/results/replica-shm-tcp.svg \
    | tee bench/results/replica-shm-tcp.txt
bash bench/peers/redis-compare.sh bench/results/replica-redis-compare-tcp.md
