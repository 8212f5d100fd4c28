#!/usr/bin/env bash
# Fuzz the tcp fabric's decoders of network bytes (frame decoder, handshake),
# bounded in time.
#
#   scripts/fuzz.sh [SECONDS_PER_TARGET]      (default 60)
#
# With cargo-fuzz and a nightly toolchain (`cargo install cargo-fuzz`), runs
# the libFuzzer targets in fuzz/ for SECONDS_PER_TARGET each. Without them,
# runs the proptest-based fuzz tests (crates/fabric/tests/tcp_fuzz.rs) with
# many cases instead: the same properties, on stable Rust, no extra tool.
# Exits non-zero on the first failure (a crash input is kept under
# fuzz/artifacts/ by cargo-fuzz; proptest prints the minimal failing case).
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_PER_TARGET=${1:-60}

if cargo +nightly fuzz --version >/dev/null 2>&1; then
    for target in frame_decoder handshake; do
        echo "== cargo fuzz run $target (${SECONDS_PER_TARGET}s)"
        (cd fuzz && cargo +nightly fuzz run "$target" -- -max_total_time="$SECONDS_PER_TARGET" -rss_limit_mb=2048)
    done
else
    cases=$((SECONDS_PER_TARGET * 2000))
    echo "== cargo-fuzz (nightly) not available: proptest fuzzing with PROPTEST_CASES=$cases"
    PROPTEST_CASES=$cases timeout $((SECONDS_PER_TARGET * 4 + 600)) \
        cargo test --release -p spindle-fabric --test tcp_fuzz
fi
