#!/usr/bin/env bash
# Issue 19, item 3: what interrupts the dispatchers' spins across network
# namespaces? The same ring on shm and across 3 namespaces (tcp over veths
# and a bridge, scripts/rt-netns.sh), with the kernel's softirq and
# interrupt counts per CPU taken before and after each run: the
# difference per second, next to each run's release jitter and its
# releases > 10 µs late because the spinning dispatcher lost its CPU.
#
#   sudo bench/rt-netns-softirq.sh [--periods N] [--deadline-us D] [--spin-us W] [--out NAME] [--lock FILE]
#
# --spin-us W: a fixed spin window for both runs (default: self-tuned).
#
# Writes bench/results/NAME.json and .txt (default rt-netns-softirq). Needs root and
# iproute2 (for the namespaces). Each run is bounded by `timeout`.
set -euo pipefail
cd "$(dirname "$0")/.."
periods=1500
deadline_us=2000
spin_us=""
name=rt-netns-softirq
lock=""
while [ $# -gt 0 ]; do
    case "$1" in
        --periods) periods="$2"; shift 2 ;;
        --deadline-us) deadline_us="$2"; shift 2 ;;
        --spin-us) spin_us="$2"; shift 2 ;;
        --out) name="$2"; shift 2 ;;
        --lock) lock="$2"; shift 2 ;;
        *) echo "unknown argument '$1' (expected --periods N, --deadline-us D, --spin-us W, --out NAME, --lock FILE)" >&2; exit 2 ;;
    esac
done
case "$periods$deadline_us${spin_us:-0}" in ''|*[!0-9]*) echo "--periods '$periods', --deadline-us '$deadline_us', --spin-us '${spin_us:-}': expected numbers" >&2; exit 2 ;; esac
bin="${SPINDLE:-target/release/spindle}"
[ -x "$bin" ] || { echo "$bin not found: cargo build --release -p spindle-cli" >&2; exit 2; }
command -v jq >/dev/null || { echo "needs jq" >&2; exit 2; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# /proc/softirqs and /proc/interrupts as {"NAME": [cpu0, cpu1, …]}.
counts() {
    ncpu=$(nproc)
    { awk 'NR > 1 { name = $1; sub(":", "", name); printf "%s", "softirq " name; for (i = 2; i <= NF; i++) printf " %s", $i; print "" }' /proc/softirqs
      awk -v n="$ncpu" 'NR > 1 { name = $1; sub(":", "", name); printf "irq %s", name; for (i = 2; i <= n + 1; i++) printf " %s", $i; print "" }' /proc/interrupts; } |
    jq -R -s 'split("\n") | map(select(length > 0) | split(" ")) | map({key: (.[0] + " " + .[1]), value: (.[2:] | map(tonumber? // 0))}) | from_entries'
}
# One run: counts before and after, the ring's JSON; a row.
measure() { # label json -- command…
    local label=$1 json=$2; shift 3
    # The lock (if any) around the counts and the run only.
    if [ -n "$lock" ]; then exec 9>>"$lock"; flock 9; fi
    counts > "$tmp/before.json"
    local t0 t1
    t0=$(date +%s.%N)
    set +e
    "$@" > "$tmp/$label.txt" 2>&1
    local rc=$?
    set -e
    t1=$(date +%s.%N)
    counts > "$tmp/after.json"
    if [ -n "$lock" ]; then flock -u 9; exec 9>&-; fi
    cat "$tmp/$label.txt" >> "$tmp/all.txt"
    [ -s "$json" ] || { echo "$label: no JSON (exit $rc); its output:" >&2; tail -5 "$tmp/$label.txt" >&2; return 1; }
    jq -n --arg name "$label" --argjson rc "$rc" --argjson s "$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f", b - a }')" \
        --slurpfile b "$tmp/before.json" --slurpfile a "$tmp/after.json" --slurpfile r "$json" '
        ($a[0] | to_entries | map(.key as $k | {key: $k, value: [.value, ($b[0][$k] // [])] | transpose | map(((.[0] // 0) - (.[1] // 0)) / $s | floor)})
            | map(select(.value | add > 0)) | from_entries) as $rates
        | {run: $name, exit: $rc, seconds: $s, per_second_per_cpu: $rates,
           periods: $r[0].periods, missed: $r[0].missed, late: $r[0].late,
           release_jitter_ns: $r[0].release_jitter_ns,
           nodes: [$r[0].nodes[] | {node, release_jitter_ns, late_wakes_spin, late_wakes_sleep, spin_window_ns: .spin.window_ns,
                   run_gap_max_ns: .interference.run_gap_max_ns}]}'
}
common=(--periods "$periods" --deadline-us "$deadline_us" --clock-budget-us 200 --no-host-record --force)
extra=()
[ -n "${spin_us:-}" ] && extra=(--spin-us "$spin_us")
echo "== shm" >> "$tmp/all.txt"
measure shm "$tmp/shm.json" -- timeout 300 "$bin" rt ring "${common[@]}" "${extra[@]}" --json "$tmp/shm.json" > "$tmp/row-1.json"
echo "== tcp across 3 namespaces" >> "$tmp/all.txt"
measure netns "$tmp/netns/rt-ring-netns-x.json" -- timeout 400 scripts/rt-netns.sh --bin "$bin" --only ring \
    --periods "$periods" --deadline-us "$deadline_us" --results "$tmp/netns" --tag x -- --no-host-record --force "${extra[@]}" > "$tmp/row-2.json"
jq -s --arg cmd "bench/rt-netns-softirq.sh --periods $periods --deadline-us $deadline_us${spin_us:+ --spin-us $spin_us}${lock:+ --lock $lock}" --arg cpu "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //')" --arg k "$(uname -srm)" \
    --argjson nproc "$(nproc)" --arg date "$(date -u +%FT%TZ)" --arg load "$(cut -d' ' -f1-3 /proc/loadavg)" \
    '{command: $cmd, machine: {nproc: $nproc, cpu_model: $cpu, kernel: $k, load_after: $load}, date: $date, runs: .}' \
    "$tmp"/row-*.json > "bench/results/$name.json"
cp "$tmp/all.txt" "bench/results/$name.txt"
jq -r '.runs[] | "\(.run): \(.seconds | floor) s, missed \(.missed) late \(.late), release jitter p99 \(.release_jitter_ns.p99) ns; spins interrupted (> 10 µs late) per node \([.nodes[].late_wakes_spin]); per second per CPU: \(.per_second_per_cpu | to_entries | map(select(.key | test("NET|TIMER|SCHED|RCU|virtio|LOC|RES|CAL|TLB"))) | map("\(.key) \(.value)") | join(", "))"' "bench/results/$name.json"
echo "written: bench/results/$name.json, .txt"
