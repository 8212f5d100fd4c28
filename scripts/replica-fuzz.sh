#!/usr/bin/env bash
# Fuzz the replica's decoders of untrusted bytes (log records and replay of
# segments read back from disk; RESP requests from clients), bounded in time.
#
#   scripts/replica-fuzz.sh [SECONDS_PER_TARGET]      (default 60)
#
# With cargo-fuzz and a nightly toolchain (`cargo install cargo-fuzz`), runs
# the libFuzzer targets in crates/replica/fuzz/ for SECONDS_PER_TARGET each
# (build dir: $CARGO_TARGET_DIR, default crates/replica/fuzz/target).
# Without them, runs the proptest-based fuzz tests
# (crates/replica/tests/decoder_fuzz.rs, resp_fuzz.rs, command_fuzz.rs) with many cases
# instead: the same properties, on stable Rust, no extra tool.
# Exits non-zero on the first failure (cargo-fuzz keeps the crashing input
# under crates/replica/fuzz/artifacts/; proptest prints the minimal case).
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_PER_TARGET=${1:-60}
case "$SECONDS_PER_TARGET" in
    ''|*[!0-9]*) echo "replica-fuzz.sh: SECONDS_PER_TARGET '$SECONDS_PER_TARGET' is not a number" >&2; exit 2 ;;
esac

if cargo +nightly fuzz --version >/dev/null 2>&1; then
    for target in record_decoder replay resp_parser; do
        echo "== cargo fuzz run $target (${SECONDS_PER_TARGET}s)"
        (cd crates/replica/fuzz && cargo +nightly fuzz run "$target" -- \
            -max_total_time="$SECONDS_PER_TARGET" -rss_limit_mb=2048 -max_len=4096)
    done
else
    cases=$((SECONDS_PER_TARGET * 2000))
    echo "== cargo-fuzz (nightly) not available: proptest fuzzing with PROPTEST_CASES=$cases"
    PROPTEST_CASES=$cases timeout $((SECONDS_PER_TARGET * 8 + 600)) \
        cargo test --release -p spindle-replica --test decoder_fuzz --test resp_fuzz --test command_fuzz
fi
