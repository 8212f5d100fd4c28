#!/usr/bin/env bash
# Run plain `spindle rt ring` (no options at all) N times and record, for
# each run, whether admission accepted it and what it then missed, or why
# it was rejected at commit: bench/results/rt-ring-defaults-20.json (one
# object per run, the machine, a summary) and rt-ring-defaults-20.txt (every
# run's printed report). Issue 19: a run must be either 0 missed / 0 late,
# or rejected at commit with a reason; never accepted and then missing.
#
#   bench/rt-defaults.sh [--runs N] [--out NAME] [--lock FILE]
#
# Each run is bounded by `timeout 420` (5,000 periods of at most 50 ms: 250 s,
# plus the calibrations). The host record (`spindle rt ring
# --host-record`: $SPINDLE_RT_HOST_RECORD, else $XDG_STATE_HOME/spindle/,
# else ~/.local/state/spindle/interference-HOST.json) is what plain runs
# use and add to; each row notes what it held before the run. The script
# never removes it: delete it first to measure a host's first runs.
#
# --lock FILE: wrap each run in `flock FILE` (on a shared machine, so that
# each run has the CPUs to itself and others can work between runs).
# SPINDLE: the binary (default target/release/spindle; build it first with
# `cargo build --release -p spindle-cli`).
set -euo pipefail
cd "$(dirname "$0")/.."
runs=20
name=rt-ring-defaults-20
lock=""
while [ $# -gt 0 ]; do
    case "$1" in
        --runs) runs="$2"; shift 2 ;;
        --out) name="$2"; shift 2 ;;
        --lock) lock="$2"; shift 2 ;;
        *) echo "unknown argument '$1' (expected --runs N, --out NAME, --lock FILE)" >&2; exit 2 ;;
    esac
done
case "$runs" in ''|*[!0-9]*) echo "--runs '$runs': expected a number" >&2; exit 2 ;; esac
[ "$runs" -ge 1 ] && [ "$runs" -le 1000 ] || { echo "--runs $runs must be in 1..=1000" >&2; exit 2; }
bin="${SPINDLE:-target/release/spindle}"
[ -x "$bin" ] || { echo "$bin not found: cargo build --release -p spindle-cli" >&2; exit 2; }
command -v jq >/dev/null || { echo "needs jq" >&2; exit 2; }
host=$(cat /proc/sys/kernel/hostname)
record="${SPINDLE_RT_HOST_RECORD:-${XDG_STATE_HOME:-$HOME/.local/state}/spindle/interference-$host.json}"
record_state() {
    if [ "$record" != off ] && [ -s "$record" ]; then
        jq -c '{interference_max_ns, release_jitter_max_ns, observed_s: (.observed_ns / 1e9 | floor)}' "$record" 2>/dev/null || echo null
    else
        echo null
    fi
}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
out_json="bench/results/$name.json"
out_txt="bench/results/$name.txt"
: > "$out_txt"
# Rewritten after every run: an interrupted series keeps what it measured.
aggregate() {
    jq -s --arg cmd "$bin rt ring" --arg host "$(uname -srm), $(nproc) CPUs" --argjson planned "$runs" --arg record "$record" '{
        command: $cmd, runs_planned: $planned, runs: length, host: $host, host_record: $record,
        machine: (map(select(.machine != null)) | .[0].machine // null),
        summary: {
            ran_clean: (map(select(.outcome == "ran" and .missed == 0 and .late == 0)) | length),
            rejected_at_commit: (map(select(.outcome == "rejected at commit")) | length),
            accepted_then_missing: (map(select(.accepted_then_missing == true)) | length),
            failed: (map(select(.outcome != "ran" and .outcome != "rejected at commit")) | length),
            interference_exceeded_runs: (map(select(.interference_exceeded == true)) | length)
        },
        runs_detail: (sort_by(.run) | map(del(.machine)))
    }' "$tmp"/row-*.json > "$out_json"
}
for i in $(seq 1 "$runs"); do
    started=$(date -u +%FT%TZ)
    before=$(record_state)
    set +e
    if [ -n "$lock" ]; then
        flock "$lock" timeout 420 "$bin" rt ring --json "$tmp/run.json" > "$tmp/run.txt" 2>&1
    else
        timeout 420 "$bin" rt ring --json "$tmp/run.json" > "$tmp/run.txt" 2>&1
    fi
    rc=$?
    set -e
    ended=$(date -u +%FT%TZ)
    { echo "=== run $i: $bin rt ring (exit $rc, $started – $ended, load $(cut -d' ' -f1-3 /proc/loadavg); host record before: $before)"; cat "$tmp/run.txt"; echo; } >> "$out_txt"
    if [ -s "$tmp/run.json" ]; then
        jq --argjson run "$i" --argjson rc "$rc" --arg started "$started" --arg ended "$ended" --arg load "$(cut -d' ' -f1-3 /proc/loadavg)" --argjson before "$before" '{
            run: $run, exit: $rc, started: $started, ended: $ended, load_after: $load, host_record_before: $before,
            outcome, admitted, rejected_at_commit, period_ns, periods,
            deadline_ns: (.tasks[0].deadline_ns // null),
            missed, late, jobs, miss_rate, interference_exceeded,
            accepted_then_missing: (.outcome == "ran" and (.missed + .late) > 0),
            release_jitter_ns,
            nodes: [.nodes[] | {node, interference_admitted_ns: .interference.interference_admitted_ns,
                release_jitter_admitted_ns: .interference.release_jitter_admitted_ns,
                calibration_lost_max_ns: .interference.lost_max_ns, calibration_s: (.interference.calibration_ns / 1e9),
                run_gap_max_ns: .interference.run_gap_max_ns, run_release_late_max_ns: .interference.run_release_late_max_ns,
                run_over_admitted: .interference.run_over_admitted,
                interference_recorded_ns: .interference.interference_recorded_ns,
                release_jitter_recorded_ns: .interference.release_jitter_recorded_ns,
                late_wakes_spin, missed_early, overruns}],
            machine
        }' "$tmp/run.json" > "$tmp/row-$i.json"
    else
        jq -n --argjson run "$i" --argjson rc "$rc" --arg started "$started" --arg ended "$ended" --arg tail "$(tail -5 "$tmp/run.txt")" --argjson before "$before" \
            '{run: $run, exit: $rc, started: $started, ended: $ended, host_record_before: $before, outcome: "failed (no JSON)", output_tail: $tail}' > "$tmp/row-$i.json"
    fi
    rm -f "$tmp/run.json"
    jq -c '{run, exit, outcome, period_ns, deadline_ns, missed, late}' "$tmp/row-$i.json"
    aggregate
done
jq '.summary' "$out_json"
echo "written: $out_json, $out_txt"
