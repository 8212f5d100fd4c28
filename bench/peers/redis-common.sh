# Shared by the Redis peer scripts (sourced, after `cd` to the repository
# root): installs redis-server and redis-tools from apt when missing (needs
# root or sudo), builds `spindle` (in $bin; SPINDLE_BIN=PATH takes that binary instead), makes a work dir ($work, under
# $TMP_BASE) removed at exit together with every pid in $pids, and defines
# wait_ping PORT, start_redis PORT (a primary on PORT and 2 replicas on the
# next two ports, no persistence) and sync_writes LABEL PORT wait|nowait
# (one write at a time from a python3 client, one markdown row; needs
# $SYNC_N).
TMP_BASE=${TMP_BASE:-${TMPDIR:-/tmp}}
if ! command -v redis-server >/dev/null || ! command -v redis-benchmark >/dev/null; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q redis-server redis-tools
fi
if [ -n "${SPINDLE_BIN:-}" ]; then
  bin=$SPINDLE_BIN # a binary built elsewhere (a before/after pair)
else
  cargo build --release -q -p spindle-cli
  bin=${CARGO_TARGET_DIR:-target}/release/spindle
fi

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

start_redis() { # port: a primary there, 2 replicas on the next two ports
  local rp=$1
  redis-server --port $rp --bind 127.0.0.1 --save '' --appendonly no --dir "$work" --daemonize no > "$work/r0.log" 2>&1 &
  pids+=("$!")
  for i in 1 2; do
    redis-server --port $((rp + i)) --bind 127.0.0.1 --save '' --appendonly no --dir "$work" --replicaof 127.0.0.1 $rp --daemonize no > "$work/r$i.log" 2>&1 &
    pids+=("$!")
  done
  wait_ping $rp; wait_ping $((rp + 1)); wait_ping $((rp + 2))
  for _ in $(seq 1 100); do
    [ "$(redis-cli -p $rp info replication | grep -c 'state=online')" -ge 2 ] && break
    sleep 0.1
  done
}

# Synchronous writes one at a time (python3 client: same overhead for both).
sync_writes() { # label port wait_cmd
  python3 - "$2" "$SYNC_N" "$3" "$1" <<'PY'
import socket, sys, time
port, n, wait, label = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
s = socket.create_connection(("127.0.0.1", port)); s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
f = s.makefile("rb")
lat = []
t_start = time.perf_counter()
for i in range(n):
    req = b"*3\r\n$3\r\nSET\r\n$7\r\nsynckey\r\n$3\r\nabc\r\n"
    if wait == "wait":
        req += b"*3\r\n$4\r\nWAIT\r\n$1\r\n2\r\n$1\r\n0\r\n"
    t0 = time.perf_counter()
    s.sendall(req)
    assert f.readline().startswith(b"+OK")
    if wait == "wait":
        r = f.readline()
        assert r.startswith(b":2"), r
    lat.append(time.perf_counter() - t0)
el = time.perf_counter() - t_start
lat.sort()
q = lambda p: lat[min(len(lat) - 1, int(p * len(lat)))] * 1e6
print(f"| {label} | {n/el:,.0f} | {q(0.5):.1f} | {q(0.99):.1f} | {q(0.999):.1f} |")
PY
}
