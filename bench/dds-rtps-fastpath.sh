#!/usr/bin/env bash
# Issue 15: between Spindle participants, does the RTPS gateway slow the
# fast path? `spindle dds perf pair` (two participants on shm, reliable,
# keep-all) in three configurations, alternated round by round:
#   none     no RTPS at all (the baseline)
#   gateway  every participant runs its RTPS gateway (--rtps), the topic
#            is not bridged
#   bridge   the gateway, and the writer's participant bridges the topic
#            out to RTPS (--rtps --rtps-bridge; no RTPS reader anywhere)
# each as throughput (pub/sub, saturating) and round trip (ping/pong), at
# 16 B and 1 KB. Writes bench/results/dds-rtps-fastpath.json: every run,
# and per size and test the median over rounds with its ratio to `none`.
#
#   bash bench/dds-rtps-fastpath.sh [--rounds N] [--seconds S]
#
# SPINDLE: the binary (default target/release/spindle).
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=3
seconds=3
while [ $# -gt 0 ]; do
    case "$1" in
        --rounds) rounds="$2"; shift 2 ;;
        --seconds) seconds="$2"; shift 2 ;;
        *) echo "unknown argument '$1' (expected --rounds N, --seconds S)" >&2; exit 2 ;;
    esac
done
case "$rounds" in ''|*[!0-9]*) echo "--rounds '$rounds': expected a number" >&2; exit 2 ;; esac
bin="${SPINDLE:-target/release/spindle}"
[ -x "$bin" ] || { echo "$bin not found: cargo build --release -p spindle-cli" >&2; exit 2; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
n=0
for round in $(seq 1 "$rounds"); do
  for size in 16 1024; do
    for test in throughput latency; do
      for config in none gateway bridge; do
        flags=()
        case $config in
          gateway) flags=(--rtps) ;;
          bridge) flags=(--rtps --rtps-bridge) ;;
        esac
        [ "$test" = latency ] && flags+=(--latency)
        n=$((n + 1))
        out="$tmp/run-$n-$round-$size-$test-$config.json"
        timeout 180 "$bin" dds perf pair --size "$size" --seconds "$seconds" --domain 71 \
          "${flags[@]}" --json "$out" | tail -1 | sed "s/^/[$round $config] /"
      done
    done
  done
done
python3 - "$tmp" "$rounds" "$seconds" <<'PY'
import glob, json, os, statistics, sys
tmp, rounds, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
runs = []
for path in sorted(glob.glob(os.path.join(tmp, "run-*.json")), key=lambda p: int(os.path.basename(p).split("-")[1])):
    _, n, rnd, size, test, config = os.path.basename(path)[:-5].split("-")
    r = json.load(open(path))
    runs.append({"round": int(rnd), "size": int(size), "test": test, "config": config,
                 "throughput_samples_per_s": r["throughput_samples_per_s"],
                 "latency_ns_p50": r["latency_ns"]["p50"], "latency_ns_p99": r["latency_ns"]["p99"],
                 "written": r["written"], "received": r["received"], "machine": r["machine"]})
summary = []
for size in (16, 1024):
    for test in ("throughput", "latency"):
        row = {"size": size, "test": test}
        for config in ("none", "gateway", "bridge"):
            sel = [x for x in runs if x["size"] == size and x["test"] == test and x["config"] == config]
            key = "throughput_samples_per_s" if test == "throughput" else "latency_ns_p50"
            row[config] = statistics.median(x[key] for x in sel)
        for config in ("gateway", "bridge"):
            row[config + "_over_none"] = round(row[config] / row["none"], 3)
        summary.append(row)
out = {"what": "spindle dds perf pair (shm, reliable, keep-all): none / gateway present / topic bridged out, alternated; throughput = samples/s taken (median over rounds), latency = ping/pong round trip p50 ns (median over rounds)",
       "command": f"bash bench/dds-rtps-fastpath.sh --rounds {rounds} --seconds {seconds}",
       "machine": runs[0]["machine"], "summary": summary, "runs": runs}
json.dump(out, open("bench/results/dds-rtps-fastpath.json", "w"), indent=1)
for row in summary:
    print(row)
PY
echo "wrote bench/results/dds-rtps-fastpath.json"
