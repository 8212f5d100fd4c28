#!/usr/bin/env bash
# Ordered multicast over the ofi fabric (libfabric's software tcp
# provider) next to the tcp fabric, in the same run: 32 B and 10 KB,
# 2 members, every member sends, idle auto (park), alternating the two
# transports, ROUNDS rounds. Merges every run into one JSON file with the
# machine it ran on.
#
#   cargo build --release -p spindle-cli --features ofi
#   bash bench/ofi-vs-tcp.sh [OUT.json] [ROUNDS]
#
# Default OUT: bench/results/ofi-vs-tcp-loopback.json, ROUNDS 2. Hold the
# machine's CPU lock around it on a shared machine (flock /tmp/cpu.lock).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out=${1:-bench/results/ofi-vs-tcp-loopback.json}
rounds=${2:-2}
bin=target/release/spindle
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
for round in $(seq 1 "$rounds"); do
    for size in 32 10240; do
        count=$([ "$size" = 32 ] && echo 200000 || echo 30000)
        for transport in tcp ofi; do
            echo "round $round: $transport, $size B × $count per sender" >&2
            "$bin" bench multicast --transport "$transport" --members 2 --senders all --mode ordered \
                --size "$size" --count "$count" --no-baseline --timeout-s 300 \
                --json "$dir/$transport-$size-r$round.json" >&2
        done
    done
done
python3 - "$dir" "$out" <<'PY'
import glob, json, os, platform, subprocess, sys
src, out = sys.argv[1], sys.argv[2]
def cmd(*a):
    try:
        return subprocess.run(a, capture_output=True, text=True, check=True).stdout.strip()
    except Exception as e:
        return f"unavailable: {e}"
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
runs = []
for path in sorted(glob.glob(os.path.join(src, "*.json"))):
    name = os.path.basename(path)[:-5]
    transport, size, rnd = name.split("-")
    r = json.load(open(path))
    runs.append({"transport": transport, "size": int(size), "round": int(rnd[1:]), "report": r})
summary = {}
for run in runs:
    r = run["report"]
    key = f'{run["transport"]}-{run["size"]}B'
    summary.setdefault(key, []).append({
        "round": run["round"],
        "delivered_gbps_min": r.get("delivered_gbps_min"),
        "delivered_msgs_per_s_min": r.get("delivered_msgs_per_s_min"),
    })
json.dump({
    "what": "ordered multicast, 2 members (processes), all send, idle park; ofi = libfabric tcp provider (ofi_rxm over tcp) on loopback, tcp = Spindle's tcp fabric on loopback; same run, alternating",
    "command": "bash bench/ofi-vs-tcp.sh (spindle bench multicast --transport tcp|ofi --members 2 --senders all --mode ordered --size 32|10240 --count 200000|30000 --no-baseline)",
    "machine": {
        "cpu": cpu, "cpus": os.cpu_count(), "kernel": platform.release(),
        "loadavg_at_end": open("/proc/loadavg").read().strip(),
        "libfabric": cmd("fi_info", "--version").replace("\n", "; "),
        "note": "shared 2-vCPU VM, no RDMA NIC: the software provider's figures say nothing about a NIC's",
    },
    "summary": summary,
    "runs": runs,
}, open(out, "w"), indent=1)
print(json.dumps(summary, indent=1))
PY
