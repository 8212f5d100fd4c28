#!/usr/bin/env bash
# Log compaction's cost (issue 17): persistent mode, 3 members on shm, all
# sending, 100 B and 10 KB; compaction off, every 1 MiB and every 16 MiB
# (--compact-log-bytes), the three alternating, RUNS runs each (default 5),
# the same binary. Each run prints the slowest member's rate, latency and
# what the logs take on disk at the end; the summary (medians, ratio to no
# compaction) goes to OUT (default bench/results/persistent-compaction.json).
#   bash bench/persistent-compaction.sh [OUT.json]
# PERSIST_DIR: where the logs go (default: the current directory; a real
# disk, not a tmpfs). SPINDLE: a spindle binary to use instead of building.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-bench/results/persistent-compaction.json}
dir=${PERSIST_DIR:-.}
runs=${RUNS:-5}
if [ -z "${SPINDLE:-}" ]; then
  cargo build --release -q -p spindle-cli
  SPINDLE=target/release/spindle
fi
lines=$(mktemp)
trap 'rm -f "$lines"' EXIT
for size in 100 10240; do
  count=$(( size == 100 ? 100000 : 10000 ))
  for i in $(seq "$runs"); do
    for c in 0 1048576 16777216; do
      line=$("$SPINDLE" bench multicast --mode persistent --members 3 --size "$size" --count "$count" \
        --compact-log-bytes "$c" --persist-dir "$dir" --no-baseline 2>&1 \
        | grep -E "slowest member|persistent logs|to the slowest" | tr '\n' ' ')
      echo "size=$size count=$count compact=$c run=$i $line" | tee -a "$lines"
    done
  done
done
python3 - "$lines" "$out" <<'PY'
import json, re, statistics, sys, platform, os
rows = []
for l in open(sys.argv[1]):
    m = re.match(r"size=(\d+) count=(\d+) compact=(\d+) run=(\d+) persistent logs at the end \(bytes on disk per member\): "
                 r"\[([^\]]*)\]; log compactions per member: \[([^\]]*)\] slowest member: ([\d.]+) GB/s, (\d+) msgs/s\s+"
                 r"to the slowest member\s+(\d+) (\d+) (\d+) (\d+)", l)
    if not m:
        sys.exit("unexpected line: " + l)
    g = m.groups()
    rows.append(dict(size=int(g[0]), count=int(g[1]), compact_log_bytes=int(g[2]), run=int(g[3]),
                     log_bytes_on_disk=[int(x) for x in g[4].split(",")],
                     log_compactions=[int(x) for x in g[5].split(",")],
                     delivered_msgs_per_s_min=int(g[7]), latency_ns_p50=int(g[8]), latency_ns_p99=int(g[9])))
summary = []
for size in sorted({r["size"] for r in rows}):
    base = None
    for c in (0, 1048576, 16777216):
        rs = [r for r in rows if r["size"] == size and r["compact_log_bytes"] == c]
        med = statistics.median(r["delivered_msgs_per_s_min"] for r in rs)
        base = base or med
        summary.append(dict(size=size, compact_log_bytes=c, runs=len(rs), msgs_per_s_median=med,
                            ratio_to_no_compaction=round(med / base, 3),
                            latency_ns_p99_median=statistics.median(r["latency_ns_p99"] for r in rs),
                            log_bytes_on_disk_max=max(max(r["log_bytes_on_disk"]) for r in rs)))
        print(summary[-1])
json.dump(dict(command="bash bench/persistent-compaction.sh", machine=f"{platform.processor() or platform.machine()}, {os.cpu_count()} cpus",
               summary=summary, rows=rows), open(sys.argv[2], "w"), indent=1)
PY
