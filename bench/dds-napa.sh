#!/usr/bin/env bash
# The NAPA experiment of issue 14 on this machine: 1 publisher → 1
# subscriber, reliable, ACK every 10 samples, a saturating offered load,
# samples 5 KB – 200 KB, NAPA on vs off, over tcp on loopback, tcp across
# two network namespaces (a veth pair) and shared memory. Each pair runs
# in the same invocation, one after the other, on a fresh build.
#
#   bench/dds-napa.sh [--seconds S] [--window W] [--sizes "5120 …"] [--transports "tcp tcp-netns shm"]
#
# Env: SPINDLE_BIN (skip the build and measure that binary).
# Writes bench/results/dds-napa-<transport>-w<W>.json (one row per size
# with both runs and the ratios) and prints a table. The netns part needs
# root (ip netns, veth); it is skipped with a note otherwise.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

seconds=5
window=64
sizes="5120 10240 51200 102400 204800"
transports="tcp tcp-netns shm"
while [ $# -gt 0 ]; do
    case "$1" in
        --seconds) seconds=$2; shift 2 ;;
        --window) window=$2; shift 2 ;;
        --sizes) sizes=$2; shift 2 ;;
        --transports) transports=$2; shift 2 ;;
        *) echo "usage: $0 [--seconds S] [--window W] [--sizes \"…\"] [--transports \"tcp tcp-netns shm\"]" >&2; exit 2 ;;
    esac
done

# SPINDLE_BIN: a spindle binary to measure instead of building one.
if [ -n "${SPINDLE_BIN:-}" ]; then
    spindle=$SPINDLE_BIN
else
    cargo build --release -p spindle-cli >/dev/null
    spindle=${CARGO_TARGET_DIR:-target}/release/spindle
fi
work=$(mktemp -d /tmp/dds-napa.XXXXXX)
ns0=ddsnapa$$a
ns1=ddsnapa$$b
cleanup() {
    ip netns del "$ns0" 2>/dev/null || true
    ip netns del "$ns1" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

netns_up() {
    ip netns add "$ns0" && ip netns add "$ns1" &&
        ip link add "v$$a" type veth peer name "v$$b" &&
        ip link set "v$$a" netns "$ns0" && ip link set "v$$b" netns "$ns1" &&
        ip -n "$ns0" addr add 10.77.0.1/24 dev "v$$a" && ip -n "$ns1" addr add 10.77.0.2/24 dev "v$$b" &&
        ip -n "$ns0" link set "v$$a" up && ip -n "$ns1" link set "v$$b" up &&
        ip -n "$ns0" link set lo up && ip -n "$ns1" link set lo up
}

for transport in $transports; do
    extra=()
    case "$transport" in
        tcp) extra=(--transport tcp) ;;
        shm) extra=(--transport shm) ;;
        tcp-netns)
            if [ "$(id -u)" != 0 ] || ! netns_up 2>"$work/netns.err"; then
                echo "note: skipping tcp-netns (needs root, ip netns and veth): $(cat "$work/netns.err" 2>/dev/null)" >&2
                continue
            fi
            extra=(--transport tcp --netns "$ns0,$ns1" --peers 10.77.0.1:7400,10.77.0.2:7400) ;;
        *) echo "unknown transport $transport" >&2; exit 2 ;;
    esac
    out="bench/results/dds-napa-$transport-w$window.json"
    rows=()
    for size in $sizes; do
        for napa in off on; do
            "$spindle" dds perf pair --size "$size" --seconds "$seconds" --window "$window" --ack-every 10 \
                --napa "$napa" "${extra[@]}" --json "$work/$transport-$size-$napa.json" | tail -1
        done
        rows+=("$work/$transport-$size-off.json:$work/$transport-$size-on.json")
    done
    python3 - "$out" "$transport" "$window" "$seconds" "${rows[@]}" <<'PY'
import json, sys
out, transport, window, seconds = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
rows = []
for pair in sys.argv[5:]:
    off_path, on_path = pair.split(":")
    off, on = json.load(open(off_path)), json.load(open(on_path))
    rows.append({
        "size": off["size"],
        "off": {k: off[k] for k in ("latency_ns", "throughput_samples_per_s", "throughput_mbps", "written", "received", "writes_blocked")},
        "napa": {k: on[k] for k in ("latency_ns", "throughput_samples_per_s", "throughput_mbps", "written", "received", "writes_blocked")},
        "latency_p50_ratio_off_over_napa": off["latency_ns"]["p50"] / max(1, on["latency_ns"]["p50"]),
        "throughput_ratio_napa_over_off": on["throughput_mbps"] / max(1e-9, off["throughput_mbps"]),
    })
    machine = on["machine"]
doc = {"experiment": "dds napa: 1 pub -> 1 sub, reliable, K=10, saturating load",
       "transport": transport, "window": window, "seconds": seconds,
       "command": f"bench/dds-napa.sh --seconds {seconds:g} --window {window} --transports {transport}",
       "rows": rows, "machine": machine}
json.dump(doc, open(out, "w"), indent=1)
print(f"{transport} (window {window}): size  p50 off→napa (µs)   Mb/s off→napa   latency gain  throughput ratio")
for r in rows:
    print(f"  {r['size']:>7}  {r['off']['latency_ns']['p50']/1e3:>8.0f} → {r['napa']['latency_ns']['p50']/1e3:<8.0f} "
          f"{r['off']['throughput_mbps']:>7.0f} → {r['napa']['throughput_mbps']:<7.0f} {r['latency_p50_ratio_off_over_napa']:>6.1f}×  {r['throughput_ratio_napa_over_off']:>6.2f}")
print("wrote", out)
PY
    if [ "$transport" = tcp-netns ]; then
        ip netns del "$ns0"; ip netns del "$ns1"
    fi
done
