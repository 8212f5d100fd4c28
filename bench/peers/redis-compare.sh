#!/usr/bin/env bash
# Compare `spindle kv serve` (3 backups, one-sided and rpc, members on shm
# and on tcp loopback) with
# Debian's redis-server (a primary and 2 replicas on this host) under
#   redis-benchmark -t set,get -n 100000 -P 16
# and, for synchronous replication on both sides, a one-at-a-time
# "write then wait for the replicas" loop (Redis: SET + WAIT 2 0; Spindle:
# SET, whose +OK already means every backup has the record).
#
# Installs redis-server and redis-tools from apt when missing (needs root
# or sudo). Everything listens on 127.0.0.1 only and is stopped at exit.
#   bash bench/peers/redis-compare.sh [OUT.md]
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-bench/results/replica-redis-compare.md}
N=${N:-100000}
P=${P:-16}
SYNC_N=${SYNC_N:-20000}

WORK_PREFIX=redis-compare
# shellcheck source=bench/peers/redis-common.sh
source bench/peers/redis-common.sh

bench() { # label port
  redis-benchmark -h 127.0.0.1 -p "$2" -t set,get -n "$N" -P "$P" -q --csv 2>/dev/null \
    | awk -F, -v label="$1" 'NR>1 { for (i = 1; i <= NF; i++) gsub(/"/, "", $i); printf "| %s | %s | %s | %s | %s |\n", label, $1, $2, $5, $7 }'
}


{
echo "# spindle kv vs redis-server ($(date -u +%Y-%m-%dT%H:%MZ), $(nproc) CPUs: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs))"
echo
echo "redis-server: $(redis-server --version | head -1)"
echo
echo "## redis-benchmark -t set,get -n $N -P $P"
echo
echo "| server | test | requests/s | p50 ms | p99 ms |"
echo "|---|---|---|---|---|"
} > "$out"

# Spindle: one-sided and rpc, 3 backups, members on shm and on tcp (tcp
# members listen on port+1 … port+4, hence the steps of 10).
port=16300
for transport in shm tcp; do
for mode in one-sided rpc; do
  "$bin" kv serve --port $port --group "cmp-$transport-$mode-$$" --backups 3 --mode "$mode" --transport "$transport" \
    --data-dir "$work/spindle-$transport-$mode" > "$work/spindle-$transport-$mode.log" 2>&1 &
  sp=$!; pids+=("$sp")
  wait_ping $port
  bench "spindle kv, $transport, $mode, 3 backups (acked after every backup has it)" $port >> "$out"
  sync_writes "spindle kv, $transport, $mode, 3 backups: SET" $port nowait > "$work/sync-$transport-$mode.md"
  kill "$sp"; wait "$sp" 2>/dev/null || true
  port=$((port + 10))
done
done

# Redis: a primary and 2 replicas, no persistence (like Spindle's memory-first ack).
rp=16390
start_redis $rp
bench "redis-server primary + 2 replicas (async: acked before replicas have it)" $rp >> "$out"
sync_writes "redis-server + 2 replicas: SET + WAIT 2 0" $rp wait > "$work/sync-redis.md"

{
echo
echo "## Synchronous writes, one at a time (python3 client, $SYNC_N writes, µs)"
echo
echo "| server | writes/s | p50 µs | p99 µs | p99.9 µs |"
echo "|---|---|---|---|---|"
cat "$work"/sync-shm-*.md "$work"/sync-tcp-*.md "$work/sync-redis.md"
echo
echo "Commands: \`spindle kv serve --port PORT --backups 3 --mode one-sided|rpc --transport shm|tcp\`;"
echo "\`redis-server --save '' --appendonly no\` (+ 2 × \`--replicaof\`);"
echo "\`redis-benchmark -h 127.0.0.1 -p PORT -t set,get -n $N -P $P -q --csv\`."
} >> "$out"
cat "$out"
