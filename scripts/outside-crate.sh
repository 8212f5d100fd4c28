#!/usr/bin/env bash
# A Rust program outside the workspace that depends on `spindle` by path:
# the hello_tcp example, built as its own package (with the workspace's
# Cargo.lock, so no other versions are fetched) and run as 3 members on
# 127.0.0.1 from its config file. Prints the program's line count.
#
#   bash scripts/outside-crate.sh
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dir="$root/target/outside-crate"
rm -rf "$dir" && mkdir -p "$dir/src"
cat > "$dir/Cargo.toml" <<TOML
[package]
name = "hello-tcp-outside"
version = "0.1.0"
edition = "2021"
publish = false

[dependencies]
spindle = { path = "$root/crates/spindle" }

[workspace]

# The workspace's release profile, so the build reuses its artifacts.
[profile.release]
debug = 1
codegen-units = 4
lto = "thin"
TOML
cp "$root/Cargo.lock" "$dir/Cargo.lock"
cp "$root/crates/spindle/examples/hello_tcp.rs" "$dir/src/main.rs"
cp "$root/crates/spindle/examples/hello_tcp.toml" "$dir/group.toml"
lines=$(grep -cvE '^\s*(//|$)' "$dir/src/main.rs")
echo "outside crate: src/main.rs has $lines lines of code (comments and blank lines not counted)"
# Share the workspace's build artifacts (same profile, same locked versions).
CARGO_TARGET_DIR="$root/target" cargo build --release --manifest-path "$dir/Cargo.toml"
# Free ports and a private key file for this run.
ports=$(python3 -c 'import socket
ss=[socket.socket() for _ in range(3)]
[s.bind(("127.0.0.1",0)) for s in ss]
print(" ".join(str(s.getsockname()[1]) for s in ss))')
set -- $ports
key="$dir/group.key"
SPINDLE_MEMBER_0_ADDRESS="127.0.0.1:$1" SPINDLE_MEMBER_1_ADDRESS="127.0.0.1:$2" SPINDLE_MEMBER_2_ADDRESS="127.0.0.1:$3" \
SPINDLE_GROUP_KEY_FILE="$key" timeout 120 "$root/target/release/hello-tcp-outside" "$dir/group.toml"
rm -rf "$dir"
