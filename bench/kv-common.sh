# Shared by the bench scripts that start `spindle kv serve` themselves
# (kv-rounds.sh, kv-failover-log.sh): a work directory removed at exit
# with the service still running, and a start that waits until it answers.
# Source it after `set -euo pipefail`.
command -v redis-cli >/dev/null || { echo "redis-cli not found: apt-get install redis-tools" >&2; exit 1; }
work=$(mktemp -d)
sp=
kv_cleanup() {
  if [ -n "$sp" ]; then kill "$sp" 2>/dev/null || true; fi
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap kv_cleanup EXIT

# kv_start BIN PORT LABEL [kv serve flags…]: start the service (3 backups,
# one-sided, data in $work/dPORT, output in $work/logPORT) as $sp and wait
# (at most 30 s) until it answers PING; otherwise print its log and exit.
kv_start() {
  local bin=$1 port=$2 label=$3
  shift 3
  "$bin" kv serve --port "$port" --group "kv-$$-$port" --backups 3 --mode one-sided \
    --data-dir "$work/d$port" "$@" > "$work/log$port" 2>&1 &
  sp=$!
  for _ in $(seq 1 300); do
    kill -0 "$sp" 2>/dev/null || break
    if redis-cli -p "$port" ping >/dev/null 2>&1; then return 0; fi
    sleep 0.1
  done
  echo "spindle kv serve ($label) did not come up:" >&2
  tail -n 20 "$work/log$port" >&2
  exit 1
}

# kv_stop PORT: stop the service started last and remove its data.
kv_stop() {
  kill "$sp" 2>/dev/null || true
  wait "$sp" 2>/dev/null || true
  sp=
  rm -rf "$work/d$1"
}
