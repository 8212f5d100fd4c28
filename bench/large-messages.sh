#!/usr/bin/env bash
# Large messages next to the raw transports (issue 17): 2 members, one
# sender, 1 MiB / 16 MiB / 256 MiB messages sent through 256 KiB slots
# (the large-message path: fragments, reassembled at every member), each
# run with its raw baseline right after it in the same command: on shm a
# raw ring of the same 256 KiB slots moving the same bytes (1 producer
# process writes every byte, 1 consumer reads every byte), on tcp a raw
# TCP stream of the same messages. Each point runs with the members
# taking each message whole (copied together, one `&[u8]`: the default)
# and in place (fragment by fragment where it lies, no copy:
# `--large-delivery in-place`). Three runs per point; the JSON keeps
# every run and the median ratio.
#   bash bench/large-messages.sh [OUT.json]
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-bench/results/large-messages.json}
cargo build --release -q -p spindle-cli
bin=target/release/spindle
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for transport in shm tcp; do
  for size in 1048576 16777216 268435456; do
    count=$(( 2147483648 / size ))
    for run in 1 2 3; do
      for delivery in whole in-place; do
        echo "$transport $size $delivery run $run"
        "$bin" bench multicast --transport "$transport" --members 2 --senders one --size "$size" \
          --slot-size 262144 --count "$count" --large-delivery "$delivery" \
          --json "$work/$transport-$size-$delivery-$run.json" | grep -E "slowest|baseline"
      done
    done
  done
done
python3 - "$work" "$out" <<'PY'
import json, sys, os, statistics
work, out = sys.argv[1], sys.argv[2]
rows = []
for transport in ("shm", "tcp"):
    for size in (1048576, 16777216, 268435456):
      for delivery in ("whole", "in-place"):
        runs = [json.load(open(os.path.join(work, f"{transport}-{size}-{delivery}-{r}.json"))) for r in (1, 2, 3)]
        rows.append({
            "transport": transport,
            "size_bytes": size,
            "large_delivery": delivery,
            "messages": runs[0]["count"],
            "window_slots": runs[0]["window"],
            "delivered_gbps_slowest_member": [r["delivered_gbps_min"] for r in runs],
            "baseline_gbps": [r["baseline_gbps"] for r in runs],
            "ratio_to_baseline": [r["ratio_to_baseline"] for r in runs],
            "ratio_to_baseline_median": statistics.median(r["ratio_to_baseline"] for r in runs),
        })
result = {
    "what": "spindle bench multicast, 2 members, one sender, messages larger than the 256 KiB slot (large-message path), "
            "each run beside its raw baseline (shm: raw ring of the same slots; tcp: raw TCP stream), members taking "
            "each message whole (copied into one buffer) or in place (fragment by fragment, no copy) (issue 17)",
    "command": "bash bench/large-messages.sh",
    "target": "ratio_to_baseline >= 0.8",
    "machine": runs[0]["machine"],
    "rows": rows,
}
json.dump(result, open(out, "w"), indent=2)
open(out, "a").write("\n")
for r in rows:
    print(f"{r['transport']} {r['size_bytes'] >> 20:>4} MiB {r['large_delivery']:>8}: {statistics.median(r['delivered_gbps_slowest_member']):.2f} GB/s "
          f"vs baseline {statistics.median(r['baseline_gbps']):.2f} GB/s: ratio {r['ratio_to_baseline_median']:.2f} "
          f"(runs {', '.join(f'{x:.2f}' for x in r['ratio_to_baseline'])})")
print("written to", out)
PY
