#!/usr/bin/env bash
# Issue 19, item 4 (the seed's comparison, measured):
#
#  1. the 3-node ring (`spindle rt ring`, default task parameters for the
#     period: the largest deadline that fits) at periods 1, 2, 5, 10, 20,
#     50, 100 ms, each with its admission verdict (accepted, or rejected at
#     commit with the reason), missed / late counts and release jitter. A
#     period rejected at commit is run again with --force, so that the
#     verdict can be judged against what the run then did;
#  2. time-driven vs best-effort latency as the period shrinks (the HARE
#     thesis's Table 5.3 shape): `spindle rt compare` over the same periods
#     (--force: every period runs; each row still carries its verdict).
#
# Writes bench/results/NAME.json (every run, the machine, the date, the
# load) and NAME.md (the tables). Each run is bounded by `timeout`; the
# ring runs are short (about 10 s of periods each) so that the whole sweep
# takes 5–8 minutes.
#
#   bench/rt-periods.sh [--lock FILE] [--out NAME] [--periods-ms LIST] [--compare-periods N]
#
# --lock FILE: wrap each run (not the whole sweep) in `flock FILE`.
# SPINDLE: the binary (default target/release/spindle). Extra options for
# every run (e.g. --no-host-record) in SPINDLE_RT_ARGS.
set -euo pipefail
cd "$(dirname "$0")/.."
name=rt-periods
lock=""
periods_ms="1 2 5 10 20 50 100"
compare_periods=200
while [ $# -gt 0 ]; do
    case "$1" in
        --lock) lock="$2"; shift 2 ;;
        --out) name="$2"; shift 2 ;;
        --periods-ms) periods_ms="${2//,/ }"; shift 2 ;;
        --compare-periods) compare_periods="$2"; shift 2 ;;
        *) echo "unknown argument '$1' (expected --lock FILE, --out NAME, --periods-ms LIST, --compare-periods N)" >&2; exit 2 ;;
    esac
done
for p in $periods_ms; do
    case "$p" in ''|*[!0-9]*) echo "--periods-ms: '$p' is not a whole number of ms" >&2; exit 2 ;; esac
    [ "$p" -ge 1 ] && [ "$p" -le 1000 ] || { echo "--periods-ms: $p must be in 1..=1000" >&2; exit 2; }
done
case "$compare_periods" in ''|*[!0-9]*) echo "--compare-periods '$compare_periods': expected a number" >&2; exit 2 ;; esac
bin="${SPINDLE:-target/release/spindle}"
[ -x "$bin" ] || { echo "$bin not found: cargo build --release -p spindle-cli" >&2; exit 2; }
command -v jq >/dev/null || { echo "needs jq" >&2; exit 2; }
# shellcheck disable=SC2206
extra=(${SPINDLE_RT_ARGS:-})
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
out_json="bench/results/$name.json"
out_md="bench/results/$name.md"
locked() { if [ -n "$lock" ]; then flock "$lock" "$@"; else "$@"; fi; }
load() { cut -d' ' -f1-3 /proc/loadavg; }
started=$(date -u +%FT%TZ)
load_start=$(load)

# One ring run: its JSON reduced to one row (or a failure row).
ring_row() { # period_ms periods forced json txt rc
    local p=$1 n=$2 forced=$3 json=$4 txt=$5 rc=$6
    if [ -s "$json" ]; then
        jq --argjson p "$p" --argjson n "$n" --argjson forced "$forced" --argjson rc "$rc" --arg load "$(load)" '{
            period_ms: $p, periods: $n, forced: $forced, exit: $rc, load_after: $load,
            outcome, admitted, rejected_at_commit,
            verdicts: [.verdicts[] | select(. != null)],
            deadline_ns: (.tasks[0].deadline_ns // null),
            missed, late, jobs, miss_rate, interference_exceeded,
            release_jitter_ns, hop_latency_ns: .latency_ns,
            nodes: [.nodes[] | {node, interference_admitted_ns: .interference.interference_admitted_ns,
                release_jitter_admitted_ns: .interference.release_jitter_admitted_ns,
                run_gap_max_ns: .interference.run_gap_max_ns, run_release_late_max_ns: .interference.run_release_late_max_ns,
                spin_window_ns: .spin.window_ns}]
        }' "$json"
    else
        jq -n --argjson p "$p" --argjson n "$n" --argjson forced "$forced" --argjson rc "$rc" --arg tail "$(tail -5 "$txt")" \
            '{period_ms: $p, periods: $n, forced: $forced, exit: $rc, outcome: "failed (no JSON)", output_tail: $tail}'
    fi
}

: > "$tmp/all.txt"
i=0
for p in $periods_ms; do
    # About 10 s of periods (at most 5,000, at least 100).
    n=$(( 10000 / p )); [ "$n" -gt 5000 ] && n=5000; [ "$n" -lt 100 ] && n=100
    for forced in false true; do
        i=$((i + 1))
        args=(rt ring --period-us $((p * 1000)) --periods "$n" --json "$tmp/ring.json" "${extra[@]}")
        [ "$forced" = true ] && args+=(--force)
        rm -f "$tmp/ring.json"
        set +e
        locked timeout 180 "$bin" "${args[@]}" > "$tmp/ring.txt" 2>&1
        rc=$?
        set -e
        { echo "=== $bin ${args[*]} (exit $rc, $(date -u +%FT%TZ), load $(load))"; cat "$tmp/ring.txt"; echo; } >> "$tmp/all.txt"
        ring_row "$p" "$n" "$forced" "$tmp/ring.json" "$tmp/ring.txt" "$rc" > "$tmp/ring-$(printf %03d $i).json"
        jq -c '{period_ms, forced, outcome, missed, late, release_jitter_p99_ns: .release_jitter_ns.p99}' "$tmp/ring-$(printf %03d $i).json"
        # Forced again only when admission rejected at commit.
        [ "$(jq -r .outcome "$tmp/ring-$(printf %03d $i).json")" = "rejected at commit" ] || break
    done
done

list=$(for p in $periods_ms; do printf '%s,' $((p * 1000)); done)
list=${list%,}
args=(rt compare --period-us "$list" --periods "$compare_periods" --sizes 1024 --force --json "$tmp/compare.json" "${extra[@]}")
set +e
locked timeout 300 "$bin" "${args[@]}" > "$tmp/compare.txt" 2>&1
rc=$?
set -e
{ echo "=== $bin ${args[*]} (exit $rc, $(date -u +%FT%TZ), load $(load))"; cat "$tmp/compare.txt"; echo; } >> "$tmp/all.txt"
[ -s "$tmp/compare.json" ] || echo '{"rows": [], "failed": true}' > "$tmp/compare.json"
jq -c '.rows[] | {period_ns, tb_p50: .time_based_latency_ns.p50, be_p50: .best_effort_latency_ns.p50, late}' "$tmp/compare.json" || true

jq -s --slurpfile cmp "$tmp/compare.json" --arg started "$started" --arg ended "$(date -u +%FT%TZ)" \
    --arg load_start "$load_start" --arg load_end "$(load)" --arg bin "$bin" --arg extra "${SPINDLE_RT_ARGS:-}" \
    --arg cpu "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //')" \
    --arg uname "$(uname -srm)" --argjson nproc "$(nproc)" --arg compare_cmd "$bin ${args[*]}" '{
    command: "bench/rt-periods.sh", binary: $bin, extra_args: $extra,
    machine: {nproc: $nproc, cpu_model: $cpu, kernel: $uname, load_start: $load_start, load_end: $load_end},
    started: $started, ended: $ended,
    ring: .,
    compare: {command: $compare_cmd, rows: [$cmp[0].rows[] | {period_ns, size,
        time_based_latency_ns, best_effort_latency_ns, time_based_first_us, best_effort_first_us,
        late, admission, rejected_at_commit}]}
}' "$tmp"/ring-*.json > "$out_json"

# The tables.
{
    echo "# rt periods sweep ($(jq -r .started "$out_json") – $(jq -r .ended "$out_json"))"
    echo
    echo "Machine: $(jq -r '.machine | "\(.nproc) CPUs, \(.cpu_model), \(.kernel); load average \(.load_start) at start, \(.load_end) at end"' "$out_json")."
    echo "Command: \`bench/rt-periods.sh${lock:+ --lock $lock}\`${SPINDLE_RT_ARGS:+ (SPINDLE_RT_ARGS=$SPINDLE_RT_ARGS)}; every run's command and report in $name.txt."
    echo
    echo "## Ring (3 nodes, 9 tasks, default parameters for the period)"
    echo
    echo "| period | periods run | D (every task) | verdict | missed | late | release jitter p50 / p99 / max (µs) | interference exceeded |"
    echo "|---|---|---|---|---|---|---|---|"
    jq -r '.ring[] | "| \(.period_ms) ms | \(if .outcome == "ran" then .periods else 0 end) | \((.deadline_ns // 0) / 1000 | floor) µs | \(if .outcome == "rejected at commit" then "rejected at commit" elif .forced then "rejected, run with --force" elif .outcome == "ran" then "accepted" else .outcome end) | \(.missed // "—") | \(.late // "—") | \(if .outcome == "ran" then "\(.release_jitter_ns.p50 / 1000 | floor) / \(.release_jitter_ns.p99 / 1000 | floor) / \(.release_jitter_ns.max / 1000 | floor)" else "—" end) | \(.interference_exceeded // "—") |"' "$out_json"
    echo
    echo "Rejections (the first node's reason):"
    echo
    jq -r '.ring[] | select(.outcome == "rejected at commit") | "- \(.period_ms) ms: \(.rejected_at_commit)"' "$out_json"
    echo
    echo "## Time-driven vs best-effort latency (Table 5.3 shape, 1 KB, \`--force\`)"
    echo
    echo "| period | time-driven p50 / p99 (µs) | best-effort p50 / p99 (µs) | late jobs | admission (sender; receiver) |"
    echo "|---|---|---|---|---|"
    jq -r '.compare.rows[] | "| \(.period_ns / 1000000) ms | \(.time_based_latency_ns.p50 / 1000 | floor) / \(.time_based_latency_ns.p99 / 1000 | floor) | \(.best_effort_latency_ns.p50 / 1000 | floor) / \(.best_effort_latency_ns.p99 / 1000 | floor) | \(.late) | \([.admission[] | if startswith("admitted") then "admitted" else "REJECTED" end] | join("; ")) |"' "$out_json"
} > "$out_md"
cp "$tmp/all.txt" "bench/results/$name.txt"
echo "written: $out_json, $out_md, bench/results/$name.txt"
