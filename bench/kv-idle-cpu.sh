#!/usr/bin/env bash
# What an idle `spindle kv serve` costs: the CPU of its member processes
# (user + system ticks from /proc/PID/stat) and their wake-ups
# (voluntary context switches from /proc/PID/task/*/status) over a few
# seconds with no client, 3 backups, one-sided, for each binary given and
# each transport, alternated ROUNDS times. Writes JSON to OUT (default
# bench/results/kv-idle-cpu.json).
#   [ROUNDS=2] [SECONDS_IDLE=5] [KV_TRANSPORTS="shm tcp"] bash bench/kv-idle-cpu.sh OUT BIN [BIN...]
# Needs redis-cli (Debian's redis-tools) to see the service answer.
set -euo pipefail
out=${1:?usage: kv-idle-cpu.sh OUT BIN [BIN...]}
shift
[ $# -ge 1 ] || { echo "usage: kv-idle-cpu.sh OUT BIN [BIN...]" >&2; exit 1; }
rounds=${ROUNDS:-2}
seconds=${SECONDS_IDLE:-5}
transports=${KV_TRANSPORTS:-shm tcp}
command -v redis-cli >/dev/null || { echo "redis-cli not found: apt-get install redis-tools" >&2; exit 1; }
hz=$(getconf CLK_TCK)
rows=$(mktemp)
sp=
trap 'rm -f "$rows"; [ -z "$sp" ] || kill $sp 2>/dev/null || true' EXIT
port=17700
for round in $(seq 1 "$rounds"); do
  for transport in $transports; do
    for bin in "$@"; do
      d=$(mktemp -d)
      "$bin" kv serve --port $port --group "kvidle-$$-$port" --backups 3 --mode one-sided \
        --transport "$transport" --data-dir "$d/data" > "$d/log" 2>&1 &
      sp=$!
      for _ in $(seq 1 200); do redis-cli -p $port ping >/dev/null 2>&1 && break; sleep 0.1; done
      sleep 1
      members=$(pgrep -P $sp | tr '\n' ' ')
      ticks() { local s=0; for p in $members; do s=$((s + $(awk '{print $14 + $15}' /proc/$p/stat))); done; echo $s; }
      wakes() { local s=0; for p in $members; do s=$((s + $(cat /proc/$p/task/*/status | awk '/^voluntary_ctxt_switches/ {s += $2} END {print s + 0}'))); done; echo $s; }
      t0=$(ticks); w0=$(wakes); sleep "$seconds"; t1=$(ticks); w1=$(wakes)
      kill $sp; wait $sp 2>/dev/null || true
      sp=
      rm -rf "$d"
      n=$(echo $members | wc -w)
      echo "$round $transport $bin $n $((t1 - t0)) $((w1 - w0))" >> "$rows"
      echo "round $round $transport $bin: $n members, $((t1 - t0)) ticks, $((w1 - w0)) wake-ups in $seconds s"
      port=$((port + 10))
    done
  done
done
python3 - "$rows" "$out" "$seconds" "$hz" <<'PY'
import json, sys, platform, os
rows_file, out, seconds, hz = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4])
rows = []
for line in open(rows_file):
    rnd, transport, binary, members, ticks, wakes = line.split()
    rows.append({
        "round": int(rnd), "transport": transport, "binary": binary, "members": int(members),
        "cpu_percent_of_one_core": round(int(ticks) / hz / seconds * 100, 1),
        "wakeups_per_s": round(int(wakes) / seconds),
    })
model = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "")
json.dump({
    "what": "idle spindle kv serve (3 backups, one-sided, no client): CPU and voluntary wake-ups of its member processes",
    "command": "bash bench/kv-idle-cpu.sh " + out + " " + " ".join(sorted({r["binary"] for r in rows})),
    "seconds_idle": seconds,
    "machine": {"cpus": os.cpu_count(), "cpu_model": model, "kernel": platform.release()},
    "rows": rows,
}, open(out, "w"), indent=1)
print("wrote", out)
PY
