#!/usr/bin/env bash
# Run the rt benchmarks of issue 6 and record them in bench/results/.
# Usage: scripts/rt-bench.sh [path/to/spindle]   (default: target/release/spindle)
set -euo pipefail
cd "$(dirname "$0")/.."
SPINDLE=${1:-target/release/spindle}
R=bench/results
run() { # name, args...
  local name=$1; shift
  echo "== spindle rt $*" | tee "$R/$name.txt"
  "$SPINDLE" rt "$@" --json "$R/$name.json" --plot "$R/$name.svg" 2>&1 | tee -a "$R/$name.txt"
}
# The ring with deadlines admission accepts against this VM's measured
# multi-millisecond stalls, 4 B and 1 KB.
run rt-ring-4B-d6500 ring --deadline-us 6500 --size 4
run rt-ring-1KB-d6500 ring --deadline-us 6500 --size 1024
# The ring with defaults chosen from a 2 s calibration (stalls it did not see cause misses).
run rt-ring-4B ring --size 4
# Table 5.1's exact parameters: admission's verdict, then the run anyway.
run rt-ring-table-5.1 ring --params table-5.1 --size 4
# Release jitter without SCHED_FIFO.
run rt-ring-4B-nofifo ring --size 4 --periods 2000 --no-fifo
run rt-latency latency --period-us 30000 --deadline-us 6500 --periods 300
run rt-compare compare --deadline-us 6500 --period-us 30000,60000,120000 --periods 150
run rt-clock clock --duration-s 10
run rt-clock-nofifo clock --duration-s 10 --no-fifo
