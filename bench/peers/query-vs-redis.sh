#!/usr/bin/env bash
# A read from one replica, side by side in one run:
#   - `spindle bench query` (a point-to-point query to a member of another
#     shard, answered from its replica), on shm and on tcp loopback, idle;
#   - redis-server's GET, one client, one request at a time
#     (`redis-benchmark -t get -c 1 -P 1`), on tcp loopback and on a unix
#     socket.
# Same reply size on both sides (-d / --size). Writes
# bench/results/query-vs-redis.json (or $1) with the ratios.
#
# Installs redis-server and redis-tools from apt when missing (needs root
# or sudo). Everything listens on 127.0.0.1 or in a temporary directory
# and is stopped at exit.
#   bash bench/peers/query-vs-redis.sh [OUT.json]
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-bench/results/query-vs-redis.json}
N=${N:-100000}
SIZE=${SIZE:-64}

WORK_PREFIX=query-vs-redis
# shellcheck source=bench/peers/redis-common.sh
source bench/peers/redis-common.sh

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
redis-server --port "$port" --bind 127.0.0.1 --unixsocket "$work/redis.sock" --save "" --appendonly no \
  --daemonize no --dir "$work" >"$work/redis.log" 2>&1 &
pids+=($!)
wait_ping "$port"

redis_get() { # label, then how to reach it
  local label=$1; shift
  redis-cli "$@" set key:__rand_int__ x >/dev/null
  redis-benchmark "$@" -t get -c 1 -P 1 -n "$N" -d "$SIZE" -r 1 --csv 2>/dev/null \
    | python3 -c '
import csv, json, sys
label = sys.argv[1]
rows = list(csv.reader(sys.stdin))
head, row = rows[0], rows[1]
d = dict(zip(head, row))
ns = lambda k: round(float(d[k]) * 1e6)
print(json.dumps({"peer": label, "requests_per_s": float(d["rps"]), "latency_ns": {"p50": ns("p50_latency_ms"), "p99": ns("p99_latency_ms")}}))
' "$label"
}

spindle_query() { # transport
  "$bin" bench query --transport "$1" --size "$SIZE" --count "$N" --json "$work/q-$1.json" >&2
  cat "$work/q-$1.json"
}

q_shm=$(spindle_query shm)
r_tcp=$(redis_get "redis-server GET, tcp loopback" -h 127.0.0.1 -p "$port")
q_tcp=$(spindle_query tcp)
r_unix=$(redis_get "redis-server GET, unix socket" -s "$work/redis.sock")

python3 - "$out" "$q_shm" "$q_tcp" "$r_tcp" "$r_unix" "$(redis-server --version | head -1)" <<'PY'
import json, sys, subprocess, datetime
out, q_shm, q_tcp, r_tcp, r_unix, version = sys.argv[1], *map(json.loads, sys.argv[2:6]), sys.argv[6]
ratio = lambda a, b: round(b["latency_ns"]["p50"] / a["latency_ns"]["p50"], 2)
doc = {
    "what": "a read from one replica, one request at a time: spindle's point-to-point query (Sharded::query to a member of another shard, 4 member threads, 2 shards of 2) against redis-server GET with one client (redis-benchmark -t get -c 1 -P 1), the same reply size, in one run",
    "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"),
    "machine": q_shm["machine"],
    "redis": version,
    "spindle_shm": q_shm,
    "spindle_tcp": q_tcp,
    "redis_tcp": r_tcp,
    "redis_unix_socket": r_unix,
    "redis_tcp_p50_over_spindle_tcp_p50": ratio(q_tcp, r_tcp),
    "redis_unix_p50_over_spindle_shm_p50": ratio(q_shm, r_unix),
    "note": "redis-benchmark reports latency in ms with 3 decimals (1 us resolution)",
}
json.dump(doc, open(out, "w"), indent=1)
print(f"spindle query p50: shm {q_shm['latency_ns']['p50']} ns, tcp {q_tcp['latency_ns']['p50']} ns; "
      f"redis GET p50: unix {r_unix['latency_ns']['p50']} ns, tcp {r_tcp['latency_ns']['p50']} ns; "
      f"redis/spindle: tcp {doc['redis_tcp_p50_over_spindle_tcp_p50']}x, unix/shm {doc['redis_unix_p50_over_spindle_shm_p50']}x -> {out}")
PY
