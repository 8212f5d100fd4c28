#!/usr/bin/env bash
# Before/after comparison of two `spindle` binaries in one run, alternating
# them so the host's drift hits both alike: shm multicast (10 KB and 32 B,
# one sender, 2 members) three rounds each, then `bench failover` (shm,
# kill) once each. Writes every JSON and a summary (medians, after/before)
# to OUT_DIR.
#
#   bash bench/before-after.sh BEFORE_BIN AFTER_BIN OUT_DIR
set -euo pipefail
before=$1 after=$2 out=$3
mkdir -p "$out"
rounds=${ROUNDS:-3}
for round in $(seq 1 "$rounds"); do
    for side in before after; do
        bin=${!side}
        "$bin" bench multicast --members 2 --senders one --size 10240 --count 500000 --idle spin --pin \
            --json "$out/$side-10k-$round.json" >/dev/null
        "$bin" bench multicast --members 2 --senders one --size 32 --count 20000000 --idle spin --pin \
            --json "$out/$side-32b-$round.json" >/dev/null
        echo "round $round $side done"
    done
done
for side in before after; do
    bin=${!side}
    "$bin" bench failover --transport shm --fault kill --runs 10 --json "$out/$side-failover.json" >/dev/null
done
python3 - "$out" "$rounds" <<'PY'
import json, statistics, sys, platform, os
out, rounds = sys.argv[1], int(sys.argv[2])
def load(name): return json.load(open(os.path.join(out, name)))
rows = {}
for side in ("before", "after"):
    r = {}
    r["10k_gbps"] = statistics.median(load(f"{side}-10k-{i}.json")["delivered_gbps_min"] for i in range(1, rounds + 1))
    r["10k_ratio_to_raw_ring"] = statistics.median(load(f"{side}-10k-{i}.json")["ratio_to_baseline"] for i in range(1, rounds + 1))
    r["32b_msgs_per_s"] = statistics.median(load(f"{side}-32b-{i}.json")["delivered_msgs_per_s_min"] for i in range(1, rounds + 1))
    f = load(f"{side}-failover.json")
    r["failover_ns_p50"] = f["failover_ns"]["p50"]
    r["failover_ns_p99"] = f["failover_ns"]["p99"]
    rows[side] = r
summary = {
    "what": "spindle bench multicast (shm, 2 members, one sender) and bench failover (shm, kill), before vs after, alternating in one run; medians of the rounds",
    "rounds": rounds,
    "before": rows["before"],
    "after": rows["after"],
    "after_over_before": {k: rows["after"][k] / rows["before"][k] for k in rows["before"]},
    "machine": load("after-10k-1.json").get("machine"),
}
json.dump(summary, open(os.path.join(out, "summary.json"), "w"), indent=2)
print(json.dumps(summary, indent=2))
PY
