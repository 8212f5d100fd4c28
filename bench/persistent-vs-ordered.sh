#!/usr/bin/env bash
# Persistent delivery next to Ordered and next to the disk (issue 17):
# 3 members on shm, 100 B and 10 KB, each size run in Ordered mode and in
# Persistent mode back to back (same build, same machine, same disk), and a
# low-rate pass for latency (one sender at 2,000 msgs/s: with every member
# sending at a low rate, ordered latency is set by the null rule, not by
# the disk). The persistent runs also measure, on the
# directory the logs were in, a write + fdatasync loop (one message per
# sync: the disk's limit without group commit) and the disk's streaming
# bandwidth (1 MiB writes, a sync per 64 MiB).
#   bash bench/persistent-vs-ordered.sh [OUT.json]
# PERSIST_DIR: where the logs go (default: the current directory; not a
# tmpfs, where fdatasync costs nothing).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-bench/results/persistent-vs-ordered.json}
dir=${PERSIST_DIR:-.}
cargo build --release -q -p spindle-cli
bin=target/release/spindle
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for size in 100 10240; do
  count=$(( size == 100 ? 200000 : 20000 ))
  for mode in ordered persistent; do
    "$bin" bench multicast --members 3 --size "$size" --count "$count" --mode "$mode" \
      --persist-dir "$dir" --no-baseline --json "$work/thr-$mode-$size.json" | tail -3
    "$bin" bench multicast --members 3 --senders one --size "$size" --count 5000 --rate 2000 --mode "$mode" \
      --persist-dir "$dir" --no-baseline --json "$work/lat-$mode-$size.json" | tail -3
  done
done
python3 - "$work" "$out" <<'PY'
import json, sys, os
work, out = sys.argv[1], sys.argv[2]
load = lambda n: json.load(open(os.path.join(work, n)))
rows = []
for size in (100, 10240):
    o, p = load(f"thr-ordered-{size}.json"), load(f"thr-persistent-{size}.json")
    lo, lp = load(f"lat-ordered-{size}.json"), load(f"lat-persistent-{size}.json")
    f = p["fsync_loop"]
    rows.append({
        "size": size,
        "ordered_msgs_per_s": o["delivered_msgs_per_s_min"],
        "persistent_msgs_per_s": p["delivered_msgs_per_s_min"],
        "ratio_persistent_to_ordered": p["delivered_msgs_per_s_min"] / o["delivered_msgs_per_s_min"],
        "persistent_written_mb_per_s_all_members": p["delivered_gbps_min"] * 1e3 * p["members"],
        "fsync_loop_syncs_per_s": f["syncs_per_s"],
        "ratio_persistent_msgs_to_fsync_loop_syncs": p["delivered_msgs_per_s_min"] / f["syncs_per_s"],
        "fsync_loop_sync_ns": f["sync_ns"],
        "disk_streaming_mb_per_s": f["streaming_mb_per_s"],
        "latency_ns_one_sender_at_2000_per_s": {
            "ordered_p50": lo["latency_ns"]["p50"], "ordered_p99": lo["latency_ns"]["p99"],
            "persistent_p50": lp["latency_ns"]["p50"], "persistent_p99": lp["latency_ns"]["p99"],
        },
    })
result = {
    "what": "spindle bench multicast, 3 members on shm, senders=all; Ordered then Persistent, same build and disk (issue 17)",
    "command": "bash bench/persistent-vs-ordered.sh",
    "machine": p["machine"],
    "persist_dir": f["dir"].rsplit("/", 1)[0],
    "rows": rows,
}
json.dump(result, open(out, "w"), indent=2)
open(out, "a").write("\n")
for r in rows:
    print(f"{r['size']:>6} B: ordered {r['ordered_msgs_per_s']:,.0f}/s, persistent {r['persistent_msgs_per_s']:,.0f}/s "
          f"({r['ratio_persistent_to_ordered']:.2f}x); fsync loop {r['fsync_loop_syncs_per_s']:,.0f}/s "
          f"({r['ratio_persistent_msgs_to_fsync_loop_syncs']:.0f}x); disk streams {r['disk_streaming_mb_per_s']:.0f} MB/s, "
          f"members wrote {r['persistent_written_mb_per_s_all_members']:.0f} MB/s; latency p50 "
          f"{r['latency_ns_one_sender_at_2000_per_s']['ordered_p50']} / {r['latency_ns_one_sender_at_2000_per_s']['persistent_p50']} ns")
print("written to", out)
PY
