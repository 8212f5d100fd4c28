#!/usr/bin/env bash
# Pipelined and one-at-a-time SET/GET against `spindle kv serve` (3 backups,
# one-sided), members on tcp loopback then on shm, for one spindle binary:
# run it with two binaries one after the other for a before/after pair
# (bench/results/kv-group-commit-before-after.json was made this way).
#   [KV_MODE=one-sided|rpc] [KV_TRANSPORTS="tcp shm"] [N=100000] bash bench/kv-pipelined.sh [SPINDLE_BIN] [LABEL]
# Needs redis-cli and redis-benchmark (Debian's redis-tools). Listens on
# 127.0.0.1 only; every process it starts is stopped at exit.
set -u
bin=${1:-target/release/spindle}
label=${2:-$bin}
mode=${KV_MODE:-one-sided} # KV_MODE=rpc for the rpc store
transports=${KV_TRANSPORTS:-tcp shm}
n=${N:-100000} # requests of each pipelined test
command -v redis-benchmark >/dev/null || { echo "redis-benchmark not found: apt-get install redis-tools" >&2; exit 1; }
port=17300
for transport in $transports; do
  d=$(mktemp -d)
  "$bin" kv serve --port $port --group "kvp-$transport-$$" --backups 3 --mode "$mode" \
    --transport $transport --data-dir "$d/data" > "$d/log" 2>&1 &
  sp=$!
  for _ in $(seq 1 200); do redis-cli -p $port ping >/dev/null 2>&1 && break; sleep 0.1; done
  echo "== $label $transport $mode"
  redis-benchmark -h 127.0.0.1 -p $port -t set,get -n "$n" -P 16 -q --csv 2>/dev/null | tail -n +2
  redis-benchmark -h 127.0.0.1 -p $port -t set -n 20000 -c 1 -P 1 -q --csv 2>/dev/null | tail -n +2
  kill $sp; wait $sp 2>/dev/null
  rm -rf "$d"
  port=$((port + 10))
done
