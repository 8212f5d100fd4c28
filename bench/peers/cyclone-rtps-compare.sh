#!/usr/bin/env bash
# Spindle's RTPS gateway next to Cyclone DDS on the same loopback path
# (issue 15): throughput and delivery of ddsperf's KeyedSeq, reliable,
# keep-all, unpaced, for each size:
#
#   cyclone->cyclone   ddsperf pub            -> ddsperf sub
#   cyclone->spindle   ddsperf pub            -> spindle dds sub --rtps
#   spindle->cyclone   spindle dds pub --rtps -> ddsperf sub
#
# The receiver's rate is what counts (samples taken per second while
# samples arrive), with the gaps it saw (ddsperf's "lost"; Spindle's
# out-of-order count). Everything stays on 127.0.0.1 (CYCLONEDDS_URI from
# `spindle dds sub --print-cyclone-uri`, Spindle with --loopback-only).
# Installs cyclonedds-tools from apt when ddsperf is missing (needs root).
# Every process is bounded by `timeout`.
#   bash bench/peers/cyclone-rtps-compare.sh [--seconds S] [--sizes "16 1024"] [--out FILE]
set -euo pipefail
cd "$(dirname "$0")/../.."

run_s=5
sizes="16 1024"
out=bench/results/rtps-vs-cyclone.json
while [ $# -gt 0 ]; do
  case "$1" in
    --seconds) run_s=$2; shift 2 ;;
    --sizes) sizes=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done

if ! command -v ddsperf >/dev/null 2>&1; then
  apt-get update -qq && apt-get install -y -qq cyclonedds-tools >/dev/null
fi
spindle=${SPINDLE_BIN:-}
if [ -z "$spindle" ]; then
  cargo build --release -q -p spindle-cli
  spindle=target/release/spindle
fi
export CYCLONEDDS_URI="$("$spindle" dds sub --print-cyclone-uri)"
tmp=$(mktemp -d)
trap 'pkill -f "ddsperf -i 7" 2>/dev/null || true; rm -rf "$tmp"' EXIT
domain=70

# The receiver rate and gaps from a ddsperf sub log: the mean of the
# per-second rates while samples arrived, the last total and lost.
ddsperf_summary() {
  python3 - "$1" <<'EOF'
import re, sys, json
rates, total, lost = [], 0, 0
for line in open(sys.argv[1]):
    m = re.search(r"total (\d+) lost (\d+) delta (\d+) lost \d+ rate ([\d.]+) kS/s", line)
    if m:
        total, lost = int(m.group(1)), int(m.group(2))
        if int(m.group(3)) > 0:
            rates.append(float(m.group(4)) * 1000)
# Drop the first and last partial seconds when there are enough.
core = rates[1:-1] if len(rates) > 2 else rates
print(json.dumps({"samples_per_s": sum(core) / len(core) if core else 0.0, "samples": total, "lost": lost}))
EOF
}

results=()
for size in $sizes; do
  domain=$((domain + 1))
  # cyclone -> cyclone
  timeout $((run_s + 20)) ddsperf -i $domain -k all -D $((run_s + 3)) sub > "$tmp/cc-sub.log" 2>&1 &
  sub=$!
  sleep 1
  timeout $((run_s + 10)) ddsperf -i $domain -k all -D "$run_s" pub size "$size" > /dev/null 2>&1 || true
  wait $sub || true
  cc=$(ddsperf_summary "$tmp/cc-sub.log")

  # cyclone -> spindle
  domain=$((domain + 1))
  timeout $((run_s + 40)) "$spindle" dds sub --rtps --loopback-only --domain $domain \
    --seconds $((run_s + 3)) --match-wait-s 20 --json "$tmp/cs.json" > "$tmp/cs.log" 2>&1 &
  sub=$!
  sleep 1
  timeout $((run_s + 10)) ddsperf -i $domain -k all -D "$run_s" pub size "$size" > /dev/null 2>&1 || true
  wait $sub || true
  cs=$(python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(json.dumps({"samples_per_s": d["samples_per_s"], "samples": d["samples"], "in_order": d["in_order"], "out_of_order_listed": len(d["out_of_order"]), "rtps_samples_lost": (d.get("bridge") or {}).get("rtps_samples_lost")}))' "$tmp/cs.json" 2>/dev/null || echo '{"samples_per_s": 0, "error": "no result"}')

  # spindle -> cyclone
  domain=$((domain + 1))
  timeout $((run_s + 30)) ddsperf -i $domain -k all -D $((run_s + 8)) sub > "$tmp/sc-sub.log" 2>&1 &
  sub=$!
  sleep 1
  timeout $((run_s + 20)) "$spindle" dds pub --rtps --loopback-only --domain $domain --size "$size" \
    --seconds "$run_s" --json "$tmp/sc.json" > "$tmp/sc.log" 2>&1 || true
  wait $sub || true
  sc=$(ddsperf_summary "$tmp/sc-sub.log")

  results+=("$(python3 - "$size" "$cc" "$cs" "$sc" <<'EOF'
import json, sys
size = int(sys.argv[1]); cc, cs, sc = (json.loads(a) for a in sys.argv[2:5])
base = cc["samples_per_s"] or 1.0
print(json.dumps({
    "size_bytes": size,
    "cyclone_to_cyclone": cc,
    "cyclone_to_spindle": cs,
    "spindle_to_cyclone": sc,
    "ratio_cyclone_to_spindle_vs_cyclone": cs.get("samples_per_s", 0) / base,
    "ratio_spindle_to_cyclone_vs_cyclone": sc["samples_per_s"] / base,
}))
EOF
)")
done

python3 - "$out" "$run_s" "${results[@]}" <<'EOF'
import json, sys, platform, os
out, run_s, rows = sys.argv[1], int(sys.argv[2]), [json.loads(r) for r in sys.argv[3:]]
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "unknown")
doc = {
    "bench": "bench/peers/cyclone-rtps-compare.sh",
    "what": "KeyedSeq, reliable, keep-all, unpaced, over RTPS on 127.0.0.1; receiver samples/s and gaps",
    "seconds": run_s,
    "machine": {"cpu_model": cpu, "cpus": os.cpu_count(), "kernel": platform.release()},
    "rows": rows,
}
json.dump(doc, open(out, "w"), indent=2)
for r in rows:
    print(f'{r["size_bytes"]:>6} B  cyclone->cyclone {r["cyclone_to_cyclone"]["samples_per_s"]:>10.0f}/s (lost {r["cyclone_to_cyclone"]["lost"]})'
          f'  cyclone->spindle {r["cyclone_to_spindle"].get("samples_per_s", 0):>10.0f}/s ({r["ratio_cyclone_to_spindle_vs_cyclone"]:.2f}x, in order {r["cyclone_to_spindle"].get("in_order")}, lost {r["cyclone_to_spindle"].get("rtps_samples_lost")})'
          f'  spindle->cyclone {r["spindle_to_cyclone"]["samples_per_s"]:>10.0f}/s ({r["ratio_spindle_to_cyclone_vs_cyclone"]:.2f}x, lost {r["spindle_to_cyclone"]["lost"]})')
print("wrote", out)
EOF
