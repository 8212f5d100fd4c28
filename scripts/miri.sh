#!/usr/bin/env bash
# Run Miri (undefined behaviour and data-race checker) over the unsafe row
# code and the lock-free send ring, bounded in time.
#
#   scripts/miri.sh [SECONDS]      (default 900, for all steps together)
#
# Needs a nightly toolchain with the miri component
# (`rustup component add miri --toolchain nightly`; the first run builds
# Miri's sysroot). Steps:
#   - spindle-fabric row::   RowRef's atomics, byte ranges and the seqlock
#                            copies (`copy_atomic` / `store_atomic`) with a
#                            writer racing a reader;
#   - spindle-group send_ring::  reserve / commit / scan.
# The shm and tcp fabrics themselves are out of Miri's reach (mmap of files,
# sockets, futexes); loom covers their lock-free protocols
# (crates/*/tests/loom_*.rs).
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_MAX=${1:-900}

if ! cargo +nightly miri --version >/dev/null 2>&1; then
    echo "miri.sh: no Miri (rustup component add miri --toolchain nightly)" >&2
    exit 2
fi
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-target/miri}
export MIRIFLAGS=${MIRIFLAGS:-"-Zmiri-strict-provenance"}
run() {
    echo "== cargo +nightly miri test $*"
    timeout "$SECONDS_MAX" cargo +nightly miri test "$@"
}
run -p spindle-fabric --lib row::
run -p spindle-group --lib send_ring::
echo "miri.sh: ok"
