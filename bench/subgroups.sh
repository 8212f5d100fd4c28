#!/usr/bin/env bash
# Shards side by side (issue 17): M members laid out into M/2 shards of 2
# by the default subgroup layout, every shard its own group, all at once,
# next to one shard of 2 alone in the same command (spindle bench
# multicast --subgroups). 32 B and 10 KB, every member of a shard sends,
# three runs per point; the JSON keeps every run and the median ratio of
# the aggregate to the one shard.
#   bash bench/subgroups.sh [OUT.json]
# SPINDLE_BIN: a built spindle (default: build one); SUBGROUP_POINTS:
# "members:shards ..." (default "4:2", and "8:4 16:8" too with 16 CPUs);
# KEEP_RUNS: a directory to copy each run's JSON into.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-bench/results/subgroups.json}
bin=${SPINDLE_BIN:-}
if [ -z "$bin" ]; then
  cargo build --release -q -p spindle-cli
  bin=target/release/spindle
fi
cpus=$(nproc)
points=${SUBGROUP_POINTS:-$([ "$cpus" -ge 16 ] && echo "4:2 8:4 16:8" || echo "4:2")}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for point in $points; do
  members=${point%:*}
  shards=${point#*:}
  pin=()
  [ "$cpus" -ge "$members" ] && pin=(--pin)
  for size in 32 10240; do
    count=$([ "$size" -eq 32 ] && echo 2000000 || echo 500000)
    for run in 1 2 3; do
      "$bin" bench multicast --members "$members" --subgroups "$shards" --size "$size" --count "$count" \
        "${pin[@]}" --json "$work/$members-$shards-$size-$run.json" | grep -E "aggregate"
    done
  done
done
if [ -n "${KEEP_RUNS:-}" ]; then cp "$work"/*.json "$KEEP_RUNS"/; fi
python3 - "$work" "$out" "$points" <<'PY'
import json, sys, os, statistics
work, out, points = sys.argv[1], sys.argv[2], sys.argv[3].split()
rows = []
for point in points:
    members, shards = map(int, point.split(":"))
    for size in (32, 10240):
        runs = [json.load(open(os.path.join(work, f"{members}-{shards}-{size}-{r}.json"))) for r in (1, 2, 3)]
        rows.append({
            "members": members,
            "shards": shards,
            "members_per_shard": runs[0]["members_per_shard"],
            "size_bytes": size,
            "messages_per_sender": runs[0]["count"],
            "pinned": runs[0]["pinned"],
            "aggregate_msgs_per_s": [r["all_shards"]["aggregate_msgs_per_s"] for r in runs],
            "one_shard_msgs_per_s": [r["one_shard"]["aggregate_msgs_per_s"] for r in runs],
            "ratio_aggregate_to_one_shard": [r["ratio_aggregate_to_one_shard"] for r in runs],
            "ratio_aggregate_to_one_shard_median": statistics.median(r["ratio_aggregate_to_one_shard"] for r in runs),
        })
result = {
    "what": "spindle bench multicast --subgroups: M members as M/2 shards of 2 (default subgroup layout), all shards at once, "
            "beside one shard of 2 alone in the same command; aggregate = every shard's messages over the span from the first "
            "member's start to the last delivery (issue 17)",
    "command": "bash bench/subgroups.sh",
    "target": "ratio_aggregate_to_one_shard >= 1.6 with 2 shards when the machine has the cores",
    "machine": runs[0]["machine"],
    "rows": rows,
}
json.dump(result, open(out, "w"), indent=2)
open(out, "a").write("\n")
for r in rows:
    print(f"{r['members']:>2} members, {r['shards']} shards, {r['size_bytes']:>5} B: aggregate "
          f"{statistics.median(r['aggregate_msgs_per_s']) / 1e6:.2f} M msgs/s vs one shard "
          f"{statistics.median(r['one_shard_msgs_per_s']) / 1e6:.2f} M: ratio {r['ratio_aggregate_to_one_shard_median']:.2f} "
          f"(runs {', '.join(f'{x:.2f}' for x in r['ratio_aggregate_to_one_shard'])})")
print("written to", out)
PY
