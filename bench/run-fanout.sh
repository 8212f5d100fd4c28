#!/usr/bin/env bash
# Regenerates every bench/results/fanout-* file (docs/fanout.md,
# bench/RESULTS-fanout.md). The fanout-16core-{calibration,bench} files
# come from a 16-core machine: run this there with FANOUT_16CORE=1 (the
# 2-core files it also writes are then that machine's: keep the ones
# from the 2-core machine).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -p spindle-cli
B=target/release/spindle
R=bench/results
uptime
$B fanout calibrate --json $R/fanout-calibration.json
$B fanout bench --iterations 20000 --warmup 2000 --json $R/fanout-bench.json --svg $R/fanout-bench.svg
$B fanout bench --procs --iterations 20000 --warmup 2000 --json $R/fanout-procs-bench.json
$B fanout sim --params $R/fanout-calibration.json --validate $R/fanout-bench.json \
    --json $R/fanout-sim.json --svg $R/fanout-sim.svg
if [ "${FANOUT_16CORE:-0}" = 1 ]; then
    $B fanout calibrate --json $R/fanout-16core-calibration.json
    $B fanout bench --members 2,3,4,6,8,12,16 --iterations 20000 --warmup 2000 \
        --json $R/fanout-16core-bench.json --svg $R/fanout-16core-bench.svg
    $B fanout bench --members 2 --procs --iterations 20000 --warmup 2000 \
        --json $R/fanout-16core-procs-bench.json
fi
$B fanout sim --params $R/fanout-16core-calibration.json --validate $R/fanout-16core-bench.json \
    --json $R/fanout-16core-sim.json --svg $R/fanout-16core-sim.svg
