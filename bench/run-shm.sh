#!/usr/bin/env bash
# Records the shm atomic-multicast figures of bench/RESULTS.md into
# bench/results/*.json (+ SVG plots). Run on a quiet machine:
#   bash bench/run-shm.sh
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -q -p spindle-cli
bin=target/release/spindle
out=bench/results
mkdir -p "$out"
run() { # name, args...
  local name=$1; shift
  echo "== $name: spindle bench multicast $*"
  "$bin" bench multicast "$@" --json "$out/$name.json" --plot "$out/$name.svg"
}
# Bandwidth, 10 KB, 2 members, ordered: one / half / all senders.
run shm-ordered-10k-2m-one  --members 2 --senders one  --size 10240 --count 500000 --idle spin --pin
run shm-ordered-10k-2m-half --members 2 --senders half --size 10240 --count 500000 --idle spin --pin
run shm-ordered-10k-2m-all  --members 2 --senders all  --size 10240 --count 250000 --idle spin --pin
run shm-ordered-10k-2m-one-selfcheck --members 2 --senders one --size 10240 --count 500000 --idle spin --self-check --pin
# Small messages, 2 members: batching on vs off.
run shm-ordered-32b-2m-one-batching   --members 2 --senders one --size 32 --count 20000000 --idle spin --pin
run shm-ordered-32b-2m-one-nobatching --members 2 --senders one --size 32 --count 5000000 --idle spin --no-batching --pin
run shm-ordered-32b-2m-all-batching   --members 2 --senders all --size 32 --count 10000000 --idle spin --pin
run shm-unordered-32b-2m-one          --members 2 --senders one --size 32 --count 20000000 --idle spin --mode unordered --pin
# Latency at a low offered rate (20,000 msgs/s), 32 B, 2 members, one sender.
run shm-latency-32b-2m-one --members 2 --senders one --size 32 --count 200000 --rate 20000 --idle spin --no-baseline --pin
# More members than cores: backoff idle strategy.
run shm-ordered-1k-3m-all --members 3 --senders all --size 1024 --count 300000 --idle backoff
run shm-ordered-1k-4m-all --members 4 --senders all --size 1024 --count 200000 --idle backoff
run shm-ordered-32b-4m-all --members 4 --senders all --size 32 --count 1000000 --idle backoff
