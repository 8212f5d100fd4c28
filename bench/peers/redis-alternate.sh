#!/usr/bin/env bash
# `spindle kv serve` beside Debian's redis-server, each Spindle run followed
# right away by the same run against Redis, ROUNDS times: on this 2-vCPU
# host the speed drifts by up to 2x within minutes, so a ratio is only
# taken between two runs a few seconds apart (bench/peers/redis-compare.sh
# runs every Spindle service first and Redis last).
#
# Redis: a primary and 2 replicas, no persistence (acknowledges before its
# replicas have a write). Spindle: BACKUPS backups (3, the issue's figure;
# BACKUPS=2 keeps as many copies as Redis: a primary and 2), one-sided, members on each
# transport of TRANSPORTS, no client but the benchmark; stopped before
# Redis runs. Each pair:
#   redis-benchmark -t set,get -n N -P 16 (50 clients)
#   SYNC_N writes one at a time (python3 client): Spindle SET (its +OK
#   means every backup has it) against Redis SET + WAIT 2 0.
# Writes OUT.json (every pair, and the median ratio of each test) and
# prints a markdown table.
#   [ROUNDS=3] [N=1000000] [SYNC_N=20000] [TRANSPORTS="shm tcp"] [BACKUPS=3] bash bench/peers/redis-alternate.sh [OUT.json]
# Installs redis-server and redis-tools from apt when missing (needs root
# or sudo). Everything listens on 127.0.0.1 only and is stopped at exit.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-bench/results/replica-redis-alternate.json}
ROUNDS=${ROUNDS:-3}
N=${N:-1000000}
P=16
SYNC_N=${SYNC_N:-20000}
TRANSPORTS=${TRANSPORTS:-shm tcp}
BACKUPS=${BACKUPS:-3}

WORK_PREFIX=redis-alternate
# shellcheck source=bench/peers/redis-common.sh
source bench/peers/redis-common.sh

rows="$work/rows"
: > "$rows"
pipelined() { # round transport server port
  redis-benchmark -h 127.0.0.1 -p "$4" -t set,get -n "$N" -P "$P" -q --csv 2>/dev/null \
    | awk -F, -v r="$1" -v t="$2" -v s="$3" 'NR>1 { for (i = 1; i <= NF; i++) gsub(/"/, "", $i); print r, t, s, $1 "-P" '"$P"', $2, $5 }' >> "$rows"
}
one_at_a_time() { # round transport server port wait|nowait
  sync_writes "x" "$4" "$5" | awk -F'|' -v r="$1" -v t="$2" -v s="$3" '{ gsub(/[ ,]/, "", $3); gsub(/ /, "", $4); print r, t, s, "SET-one-at-a-time", $3, $4 / 1000 }' >> "$rows"
}

# Redis below every Spindle port (16400 + 10 k), so no round count makes them meet.
rp=16390
start_redis $rp
port=16400
for round in $(seq 1 "$ROUNDS"); do
  for transport in $TRANSPORTS; do
    echo "round $round: spindle kv on $transport, then redis"
    "$bin" kv serve --port $port --group "alt-$transport-$$-$round" --backups "$BACKUPS" --mode one-sided \
      --transport "$transport" --data-dir "$work/spindle-$transport-$round" > "$work/spindle-$transport-$round.log" 2>&1 &
    sp=$!; pids+=("$sp")
    wait_ping $port
    # PONG could come from anything on that port (a service that failed to
    # bind may not have exited yet): the run counts only if Spindle answers.
    if ! kill -0 "$sp" 2>/dev/null || ! redis-cli -p $port info 2>/dev/null | grep -q '^member_rank:'; then
      echo "port $port is not this round's spindle kv serve:" >&2; cat "$work/spindle-$transport-$round.log" >&2; exit 1
    fi
    pipelined "$round" "$transport" spindle $port
    one_at_a_time "$round" "$transport" spindle $port nowait
    kill "$sp"; wait "$sp" 2>/dev/null || true
    redis-cli -p $rp flushall >/dev/null
    pipelined "$round" "$transport" redis $rp
    one_at_a_time "$round" "$transport" redis $rp wait
    port=$((port + 10))
  done
done

python3 - "$rows" "$out" "$N" "$SYNC_N" "$ROUNDS" "$BACKUPS" "$TRANSPORTS" <<'PY'
import json, os, platform, statistics, sys
rows_file, out, n, sync_n, rounds, backups, transports = (sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]),
                                                          int(sys.argv[5]), int(sys.argv[6]), sys.argv[7])
runs = {}
for line in open(rows_file):
    rnd, transport, server, test, rps, p50_ms = line.split()
    runs[(int(rnd), transport, test, server)] = (float(rps), float(p50_ms))
pairs, summary = [], []
for transport in sorted({k[1] for k in runs}):
    for test in sorted({k[2] for k in runs if k[1] == transport}):
        ratios, p50_ratios = [], []
        for rnd in range(1, rounds + 1):
            s, r = runs.get((rnd, transport, test, "spindle")), runs.get((rnd, transport, test, "redis"))
            if not s or not r:
                continue
            pairs.append({"round": rnd, "transport": transport, "test": test,
                          "spindle_req_per_s": s[0], "redis_req_per_s": r[0], "ratio": round(s[0] / r[0], 3),
                          "spindle_p50_ms": s[1], "redis_p50_ms": r[1]})
            ratios.append(s[0] / r[0])
            p50_ratios.append(s[1] / r[1] if r[1] else float("nan"))
        summary.append({"transport": transport, "test": test, "pairs": len(ratios),
                        "ratio_req_per_s_median": round(statistics.median(ratios), 3),
                        "ratio_req_per_s_min": round(min(ratios), 3), "ratio_req_per_s_max": round(max(ratios), 3),
                        "p50_spindle_over_redis_median": round(statistics.median(p50_ratios), 3)})
model = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "")
json.dump({
    "what": "spindle kv serve (%d backups, one-sided) then redis-server (primary + 2 replicas) right after, alternated; "
            "redis-benchmark -t set,get -P 16 and one write at a time (Spindle SET against Redis SET + WAIT 2 0)" % backups,
    "command": "ROUNDS=%d N=%d SYNC_N=%d TRANSPORTS=%r BACKUPS=%d bash bench/peers/redis-alternate.sh %s"
               % (rounds, n, sync_n, transports, backups, out),
    "spindle_backups": backups, "spindle_copies": backups + 1, "redis_copies": 3,
    "target": "ratio >= 1.0 (issue 13)",
    "machine": {"cpus": os.cpu_count(), "cpu_model": model, "kernel": platform.release()},
    "pairs": pairs, "summary": summary,
}, open(out, "w"), indent=1)
print("| transport | test | pairs | Spindle / Redis req/s: median (min-max) | p50 Spindle / Redis, median |")
print("|---|---|---|---|---|")
for s in summary:
    print("| %s | %s | %d | %.2fx (%.2f-%.2f) | %.2fx |" % (s["transport"], s["test"], s["pairs"], s["ratio_req_per_s_median"],
          s["ratio_req_per_s_min"], s["ratio_req_per_s_max"], s["p50_spindle_over_redis_median"]))
print("wrote", out)
PY
