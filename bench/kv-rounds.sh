#!/usr/bin/env bash
# Pipelined group-commit rounds, before and after: two `spindle` binaries
# alternated ROUNDS times over every case of CASES (transport:durability:
# clients), each `redis-benchmark -t set -n N -c CLIENTS -P 16` against
# `spindle kv serve --backups 3 --mode one-sided`. Records SET/s, the p50,
# the service's `group_commit_*` counters from INFO (a binary without them
# records none: main has none; the experiment of 2026-12-02 had them), the
# epoch the run ended in (every epoch after 0 is a roll), the rolls'
# counters and pauses (`log_cleanings`, `roll_pause_us_*`, where INFO has
# them), the p99 and max latency, and the share of the 2 vCPUs busy during the run
# (/proc/stat). Writes OUT.json (every run, the medians and after/before
# per case) and prints a table; OUT.json.rows keeps every run's raw row.
#   [ROUNDS=4] [N=300000] [CASES="tcp:memory:4 tcp:memory:50 tcp:disk:50 shm:memory:50"] \
#     bash bench/kv-rounds.sh BEFORE_BIN AFTER_BIN [OUT.json]
# Needs redis-benchmark and redis-cli (Debian's redis-tools). Listens on
# 127.0.0.1 only; every process it starts is stopped, and its data
# directory removed, at exit.
set -euo pipefail
before=$(realpath "$1") after=$(realpath "$2")
out=$(realpath -m "${3:-$(dirname "$0")/results/kv-rounds-before-after.json}")
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-4}
N=${N:-300000}
CASES=${CASES:-tcp:memory:4 tcp:memory:50 tcp:disk:50 shm:memory:50}
command -v redis-benchmark >/dev/null || { echo "redis-benchmark not found: apt-get install redis-tools" >&2; exit 1; }
# shellcheck source=bench/kv-common.sh
source bench/kv-common.sh
busy() { awk '/^cpu /{ print $2+$3+$4+$7+$8+$9, $5+$6 }' /proc/stat; }
# Every run's row, kept beside OUT even if a later run fails.
rows=$out.rows
: > "$rows"
port=17900
for round in $(seq 1 "$ROUNDS"); do
  for case in $CASES; do
    IFS=: read -r transport durability clients <<< "$case"
    for side in before after; do
      bin=${!side}
      port=$((port + 1))
      kv_start "$bin" $port "$side, $case" --transport "$transport" --durability "$durability"
      read -r b0 i0 < <(busy)
      line=$(redis-benchmark -h 127.0.0.1 -p $port -t set -n "$N" -c "$clients" -P 16 -q --csv 2>/dev/null | tail -n 1) \
        || { echo "redis-benchmark failed ($side, $case)" >&2; exit 1; }
      read -r b1 i1 < <(busy)
      stats=$(redis-cli -p $port info 2>/dev/null | tr -d '\r' | awk -F: '/^(group_commit_|log_cleanings|roll_pause_us_|epoch:)/ { printf "%s=%s ", $1, $2 }' || true)
      kv_stop $port
      echo "$round $side $transport $durability $clients $line $(( 100 * (b1 - b0) / (b1 - b0 + i1 - i0) )) $stats" >> "$rows"
      tail -n 1 "$rows"
    done
  done
done
python3 - "$rows" "$out" "$before" "$after" "$N" <<'PY'
import json, os, platform, statistics, sys, time
rows_path, out, before, after, n = sys.argv[1:6]
runs = []
for line in open(rows_path):
    f = line.split()
    csv = f[5].replace('"', '').split(',')
    stats = dict(kv.split('=') for kv in f[7:])
    runs.append({"round": int(f[0]), "binary": f[1], "transport": f[2], "durability": f[3],
                 "clients": int(f[4]), "set_per_s": float(csv[1]), "p50_ms": float(csv[4]),
                 "p99_ms": float(csv[6]), "max_ms": float(csv[7]),
                 "cpu_busy_percent": int(f[6]), **{k: int(v) for k, v in stats.items()}})
cases = []
for key in sorted({(r["transport"], r["durability"], r["clients"]) for r in runs}):
    med = {}
    for side in ("before", "after"):
        xs = [r["set_per_s"] for r in runs if (r["transport"], r["durability"], r["clients"]) == key and r["binary"] == side]
        med[side] = statistics.median(xs)
    cases.append({"transport": key[0], "durability": key[1], "clients": key[2],
                  "before_median_set_per_s": med["before"], "after_median_set_per_s": med["after"],
                  "after_over_before": round(med["after"] / med["before"], 3)})
doc = {"benchmark": "kv-rounds: redis-benchmark -t set -P 16 against spindle kv serve, two binaries alternated",
       "command": "bash bench/kv-rounds.sh BEFORE AFTER", "before": before, "after": after, "n": int(n),
       "machine": {"host": platform.node(), "cpus": os.cpu_count(), "kernel": platform.release(),
                   "load_avg_1m": os.getloadavg()[0]},
       "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "cases": cases, "runs": runs}
json.dump(doc, open(out, "w"), indent=1)
print("| transport | durability | clients | before SET/s (median) | after | after/before |")
print("|---|---|---|---|---|---|")
for c in cases:
    print(f"| {c['transport']} | {c['durability']} | {c['clients']} | {c['before_median_set_per_s']:,.0f} | {c['after_median_set_per_s']:,.0f} | {c['after_over_before']:.2f}x |")
PY
