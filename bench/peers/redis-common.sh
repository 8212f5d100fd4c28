# Shared by the Redis peer scripts (sourced, after `cd` to the repository
# root): installs redis-server and redis-tools from apt when missing (needs
# root or sudo), builds `spindle` (in $bin), makes a work dir ($work, under
# $TMP_BASE) removed at exit together with every pid in $pids, and defines
# wait_ping PORT.
TMP_BASE=${TMP_BASE:-${TMPDIR:-/tmp}}
if ! command -v redis-server >/dev/null || ! command -v redis-benchmark >/dev/null; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q redis-server redis-tools
fi
cargo build --release -q -p spindle-cli
bin=${CARGO_TARGET_DIR:-target}/release/spindle

work=$(mktemp -d -p "$TMP_BASE" "${WORK_PREFIX:-redis-peer}.XXXXXX")
pids=()
cleanup() {
  for p in "${pids[@]:-}"; do [ -n "$p" ] && kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

wait_ping() { # port
  for _ in $(seq 1 300); do
    [ "$(redis-cli -p "$1" ping 2>/dev/null)" = "PONG" ] && return 0
    sleep 0.1
  done
  echo "nothing answers PING on port $1" >&2; return 1
}
