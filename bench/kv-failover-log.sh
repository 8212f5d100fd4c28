#!/usr/bin/env bash
# How long a KV failover takes against how much log the new master
# replays: for each size in LOG_MIB, `spindle kv serve` (shm, 3 backups,
# one-sided) takes pipelined SETs of one key until INFO's `log_head`
# reaches the size (below 32 MiB: the default cleaning slack, 16 segments
# of 2 MiB, rolls the log before that), the master is SIGKILLed, and the
# time until a SET is acknowledged again is printed. Writes OUT.json
# (every run); OUT.json.rows keeps every run's raw row, even if a later
# one fails.
#   [ROUNDS=3] [LOG_MIB="3.5 28"] bash bench/kv-failover-log.sh [SPINDLE_BIN] [OUT.json]
# Needs redis-cli (Debian's redis-tools) and python3. Listens on 127.0.0.1
# only; every process it starts is stopped, and its data directory removed.
set -euo pipefail
root=$(realpath "$(dirname "$0")/..")
bin=$(realpath "${1:-$root/target/release/spindle}")
out=$(realpath -m "${2:-$root/bench/results/kv-failover-log.json}")
cd "$root"
ROUNDS=${ROUNDS:-3}
LOG_MIB=${LOG_MIB:-3.5 28}
for mib in $LOG_MIB; do
  python3 -c 'import sys; sys.exit(not 0 < float(sys.argv[1]) < 32)' "$mib" \
    || { echo "LOG_MIB: $mib is not above 0 and below 32 (the default cleaning slack)" >&2; exit 1; }
done
# shellcheck source=bench/kv-common.sh
source bench/kv-common.sh
cat > "$work/fill_and_kill.py" <<'PY'
import os, signal, socket, sys, time
port, log_mib, master_pid = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
def connect():
    s = socket.create_connection(("127.0.0.1", port))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s
def info(s):
    s.sendall(b"*1\r\n$4\r\nINFO\r\n")
    buf = b""
    while b"avg_ttl" not in buf:
        buf += s.recv(65536)
    return dict(l.split(b":", 1) for l in buf.split(b"\r\n") if b":" in l and not l.startswith(b"$"))
s = connect()
batch = b"*3\r\n$3\r\nSET\r\n$16\r\nkey:__rand_int__\r\n$3\r\nxxx\r\n" * 256
filling_until = time.monotonic() + 120
while True:
    if time.monotonic() > filling_until:
        sys.exit(f"the log did not reach {log_mib} MiB within 120 s (a roll cleaned it?)")
    for _ in range(50):
        s.sendall(batch)
        got = 0
        while got < 256 * 5:
            got += len(s.recv(65536))
    i = info(s)
    if int(i[b"log_head"]) >= log_mib * 2**20:
        break
killed = time.monotonic()
os.kill(master_pid, signal.SIGKILL)
while time.monotonic() - killed < 30:
    try:
        c = connect()
        c.settimeout(5)
        c.sendall(b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\nv\r\n")
        if c.recv(64).startswith(b"+OK"):
            break
        time.sleep(0.0002)  # not yet the new master's +OK
    except OSError:
        time.sleep(0.0002)
else:
    sys.exit("no SET acknowledged within 30 s of the kill")
print(int(i[b"log_head"]), int(i[b"epoch"]), round(1e3 * (time.monotonic() - killed), 2))
PY
rows=$out.rows
: > "$rows"
port=18300
for round in $(seq 1 "$ROUNDS"); do
  for mib in $LOG_MIB; do
    port=$((port + 10))
    kv_start "$bin" $port "log of $mib MiB" --transport shm
    master=$(grep -oP 'member 0: pid \K[0-9]+' "$work/log$port") || { tail -n 20 "$work/log$port" >&2; exit 1; }
    read -r head epoch ms < <(python3 "$work/fill_and_kill.py" $port "$mib" "$master")
    echo "$round $mib $head $epoch $ms" | tee -a "$rows"
    kv_stop $port
  done
done
python3 - "$rows" "$out" "$bin" <<'PY'
import json, os, platform, sys, time
rows, out, binary = sys.argv[1:4]
runs = [dict(zip(("round", "log_mib_target", "log_head_bytes", "epoch", "failover_ms"), map(float, l.split())))
        for l in open(rows)]
doc = {"benchmark": "kv failover time against the log replayed (shm, 3 backups, one key overwritten)",
       "command": "bash bench/kv-failover-log.sh", "binary": binary,
       "machine": {"host": platform.node(), "cpus": os.cpu_count(), "kernel": platform.release(),
                   "load_avg_1m": os.getloadavg()[0]},
       "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "runs": runs}
json.dump(doc, open(out, "w"), indent=1)
PY
