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

# Synchronous writes one at a time (python3 client: same overhead for both).
sync_writes() { # label port wait_cmd
  python3 - "$2" "$SYNC_N" "$3" "$1" <<'PY'
import socket, sys, time
port, n, wait, label = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
s = socket.create_connection(("127.0.0.1", port)); s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
f = s.makefile("rb")
lat = []
t_start = time.perf_counter()
for i in range(n):
    req = b"*3\r\n$3\r\nSET\r\n$7\r\nsynckey\r\n$3\r\nabc\r\n"
    if wait == "wait":
        req += b"*3\r\n$4\r\nWAIT\r\n$1\r\n2\r\n$1\r\n0\r\n"
    t0 = time.perf_counter()
    s.sendall(req)
    assert f.readline().startswith(b"+OK")
    if wait == "wait":
        r = f.readline()
        assert r.startswith(b":2"), r
    lat.append(time.perf_counter() - t0)
el = time.perf_counter() - t_start
lat.sort()
q = lambda p: lat[min(len(lat) - 1, int(p * len(lat)))] * 1e6
print(f"| {label} | {n/el:,.0f} | {q(0.5):.1f} | {q(0.99):.1f} | {q(0.999):.1f} |")
PY
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
redis-server --port $rp --bind 127.0.0.1 --save '' --appendonly no --dir "$work" --daemonize no > "$work/r0.log" 2>&1 &
pids+=("$!")
for i in 1 2; do
  redis-server --port $((rp + i)) --bind 127.0.0.1 --save '' --appendonly no --dir "$work" --replicaof 127.0.0.1 $rp --daemonize no > "$work/r$i.log" 2>&1 &
  pids+=("$!")
done
wait_ping $rp; wait_ping $((rp + 1)); wait_ping $((rp + 2))
for _ in $(seq 1 100); do
  [ "$(redis-cli -p $rp info replication | grep -c 'state=online')" -ge 2 ] && break
  sleep 0.1
done
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
