#!/usr/bin/env bash
# SET latency and throughput by durability, on one disk (one temp dir):
#   spindle kv serve --durability memory   (acked when every backup has it in memory)
#   spindle kv serve --durability disk     (acked after fdatasync at every backup; 3 backups and 1)
#   redis-server --appendonly yes --appendfsync always   (fsync before every reply)
# each measured with
#   redis-benchmark -t set -n N -P 16           (throughput: 50 clients, pipelines of 16)
#   redis-benchmark -t set -n N1 -P 1 -c 1      (one at a time: latency p50/p99)
#
# Installs redis-server and redis-tools from apt when missing (needs root
# or sudo). Everything listens on 127.0.0.1 and is stopped at exit.
#   bash bench/peers/redis-durability.sh [OUT_PREFIX]   (default bench/results/kv-durability)
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-bench/results/kv-durability}
N=${N:-50000}
N1=${N1:-2000}
BACKUPS=${BACKUPS:-3}
REPS=${REPS:-3}

WORK_PREFIX=kv-durability
# shellcheck source=bench/peers/redis-common.sh
source bench/peers/redis-common.sh

# One CSV line per run: server,run,rps,avg_ms,p50_ms,p99_ms
bench() { # server port
  redis-benchmark -h 127.0.0.1 -p "$2" -t set -n "$N" -P 16 -r 1000000 -q --csv 2>/dev/null \
    | awk -F, -v s="$1" 'NR>1 { for (i = 1; i <= NF; i++) gsub(/"/, "", $i); printf "%s,P16 c50,%s,%s,%s,%s\n", s, $2, $3, $5, $7 }'
  redis-benchmark -h 127.0.0.1 -p "$2" -t set -n "$N1" -P 1 -c 1 -r 1000000 -q --csv 2>/dev/null \
    | awk -F, -v s="$1" 'NR>1 { for (i = 1; i <= NF; i++) gsub(/"/, "", $i); printf "%s,P1 c1,%s,%s,%s,%s\n", s, $2, $3, $5, $7 }'
}

# The disk itself: fdatasync after a 72-byte append (one SET record), from
# a process that is otherwise idle.
probe_ms=$(python3 - "$work" <<'PY'
import os, sys, time
p = os.path.join(sys.argv[1], "fdatasync-probe")
fd = os.open(p, os.O_CREAT | os.O_WRONLY | os.O_APPEND)
t = []
for _ in range(200):
    os.write(fd, b"x" * 72)
    t0 = time.perf_counter(); os.fdatasync(fd); t.append(time.perf_counter() - t0)
os.close(fd); os.unlink(p)
t.sort()
print(f"{t[100] * 1e3:.3f},{t[197] * 1e3:.3f}")
PY
)
disk_dev=$(df --output=source "$work" | tail -1)
disk_fs=$(df --output=fstype "$work" | tail -1)
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
csv="$work/results.csv"
: > "$csv"

# REPS rounds, the three servers in turn in each (the disk's speed drifts:
# a round compares them under the same conditions); medians reported.
for rep in $(seq 1 "$REPS"); do
port=16500
for config in "memory $BACKUPS" "disk $BACKUPS" "disk 1"; do
  read -r durability backups <<< "$config"
  rm -rf "$work/spindle-$durability"
  "$bin" kv serve --port $port --group "dur-$durability-$$" --backups "$backups" --durability "$durability" \
    --data-dir "$work/spindle-$durability" > "$work/spindle-$durability.log" 2>&1 &
  sp=$!; pids+=("$sp")
  wait_ping $port
  bench "spindle kv durability=$durability ($backups backups)" $port >> "$csv"
  kill "$sp"; wait "$sp" 2>/dev/null || true
  port=$((port + 10))
done

rm -rf "$work/redis"; mkdir -p "$work/redis"
redis-server --port $port --bind 127.0.0.1 --save '' --appendonly yes --appendfsync always \
  --dir "$work/redis" --daemonize no > "$work/redis.log" 2>&1 &
rp=$!; pids+=("$rp")
wait_ping $port
bench "redis-server appendonly yes + appendfsync always" $port >> "$csv"
kill "$rp"; wait "$rp" 2>/dev/null || true
done
load_after=$(cut -d' ' -f1-3 /proc/loadavg)

python3 - "$csv" "$out" "$N" "$N1" "$BACKUPS" "$disk_dev" "$disk_fs" "$load_before" "$load_after" "$(redis-server --version | head -1)" "$probe_ms" <<'PY'
import csv, json, sys, datetime, os
path, out, n, n1, backups, dev, fs, load0, load1, redis_version, probe = sys.argv[1:]
probe_p50, probe_p99 = (float(x) for x in probe.split(","))
import statistics
runs = [dict(zip(["server", "run", "rps", "avg_ms", "p50_ms", "p99_ms"], r)) for r in csv.reader(open(path))]
for r in runs:
    for k in ("rps", "avg_ms", "p50_ms", "p99_ms"):
        r[k] = float(r[k])
rows = []
for key in dict.fromkeys((r["server"], r["run"]) for r in runs):
    same = [r for r in runs if (r["server"], r["run"]) == key]
    row = {"server": key[0], "run": key[1], "reps": len(same)}
    for k in ("rps", "avg_ms", "p50_ms", "p99_ms"):
        row[k] = statistics.median(r[k] for r in same)
        row[k + "_all"] = [r[k] for r in same]
    rows.append(row)
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
machine = f"{os.cpu_count()} vCPUs ({cpu}), disk {dev} ({fs}, virtio), shared with other builds"
doc = {
    "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%MZ"),
    "machine": machine,
    "load_average_before": load0, "load_average_after": load1,
    "redis": redis_version,
    "fdatasync_probe": {"what": "python3: 200 x (72-byte O_APPEND write + fdatasync) in the same dir, otherwise idle",
                        "p50_ms": probe_p50, "p99_ms": probe_p99},
    "commands": {
        "throughput": f"redis-benchmark -t set -n {n} -P 16 -r 1000000 (50 clients)",
        "latency": f"redis-benchmark -t set -n {n1} -P 1 -c 1 -r 1000000",
        "spindle": f"spindle kv serve --backups {backups}|1 --durability memory|disk --data-dir <same temp dir>",
        "redis": "redis-server --save '' --appendonly yes --appendfsync always --dir <same temp dir>",
    },
    "results": rows,
}
json.dump(doc, open(out + ".json", "w"), indent=2)
by = {(r["server"], r["run"]): r for r in rows}
redis = next(s for s, _ in by if s.startswith("redis"))
lines = [f"# SET by durability: spindle kv memory / disk vs redis appendfsync always ({doc['date']})", "",
         f"Machine: {machine}. Load average before/after: {load0} / {load1}.",
         f"The disk: fdatasync after a 72-byte append from an otherwise idle process: p50 {probe_p50:.3f} ms, p99 {probe_p99:.3f} ms.", "",
         f"Medians of {rows[0]['reps']} rounds (the three servers in turn in each round); SET/s of every round in the last column.", "",
         "| server | run | SET/s | p50 ms | p99 ms | SET/s vs redis always | p50 vs redis always | SET/s per round |",
         "|---|---|---|---|---|---|---|---|"]
for r in rows:
    base = by[(redis, r["run"])]
    lines.append(f"| {r['server']} | {r['run']} | {r['rps']:,.0f} | {r['p50_ms']:.3f} | {r['p99_ms']:.3f} | "
                 f"{r['rps'] / base['rps']:.2f}× | {r['p50_ms'] / base['p50_ms']:.2f}× | "
                 + ", ".join(f"{x:,.0f}" for x in r["rps_all"]) + " |")
lines += ["", "Commands: " + "; ".join(f"`{v}`" for v in doc["commands"].values()) + ".", ""]
open(out + ".md", "w").write("\n".join(lines))
print("\n".join(lines))
PY
