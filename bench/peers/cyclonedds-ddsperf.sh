#!/usr/bin/env bash
# Spindle's DDS side by side with Cyclone DDS's ddsperf (Debian's
# cyclonedds-tools), issue 14's goal: ≤ 0.5× Cyclone's latency and ≥ 2× its
# throughput for 16 B, 1 KB and 10 KB samples.
#
# For every size, on this host only:
#   latency     ddsperf ping + pong          vs  spindle dds perf ping + pong
#   throughput  ddsperf pub + sub            vs  spindle dds perf pub + sub
# Both stacks: reliable, keep-all (ddsperf's defaults; ping/pong keep-last-1
# in ddsperf), saturating load (ping back to back, pub as fast as possible),
# two processes, the first (ping/pub) on CPU $CPU_A, the second (pong/sub)
# on CPU $CPU_B (taskset). Cyclone runs over UDP on lo only, no multicast
# (unicast discovery to 127.0.0.1); Spindle over tcp on 127.0.0.1 (the same
# loopback) and over shm (recorded too; Cyclone's shm needs iceoryx's RouDi
# and is not used).
#
# Spindle's roles are started here one by one, each under its own taskset,
# exactly as `spindle dds perf pair` starts them (pair cannot pin each role),
# and merged the way pair merges them (bench/peers/cyclonedds-summary.py).
#
# Installs cyclonedds-tools from apt when ddsperf is missing (needs root or
# sudo). Every process is bounded by `timeout` and stopped at exit.
#   bash bench/peers/cyclonedds-ddsperf.sh [--seconds S] [--sizes "16 1024 10240"]
#        [--cpus A,B] [--out FILE]
# --cpus "" runs both stacks unpinned. Pinned, all of a process's threads
# share one CPU (Cyclone's receive, listener and timer threads too): on the
# shared 2-CPU VM, under load ~5, Cyclone's 16 B round trip measured p50
# 36 µs / p99 ~3 ms pinned against 70 µs / 0.11 ms unpinned (2 s runs).
# Env: SPINDLE_BIN (skip the build), SPINDLE_EXTRA (more `spindle dds perf`
# flags for every Spindle run, e.g. "--window 256"; recorded), CYCLONE_DOMAIN
# (ddsperf -i, default 0), TMP_BASE.
set -euo pipefail
cd "$(dirname "$0")/../.."

run_s=10
sizes="16 1024 10240"
cpus="0,1"
out=bench/results/dds-vs-cyclone.json
while [ $# -gt 0 ]; do
  case "$1" in
    --seconds) run_s=$2; shift 2 ;;
    --sizes) sizes=$2; shift 2 ;;
    --cpus) cpus=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    -h|--help) sed -n '2,31p' "$0"; exit 0 ;;
    *) echo "unknown argument: $1 (see --help)" >&2; exit 3 ;;
  esac
done
case "$run_s" in ''|*[!0-9]*|0) echo "--seconds must be a whole number ≥ 1, got '$run_s'" >&2; exit 3 ;; esac
CPU_A=${cpus%%,*}
CPU_B=${cpus#*,}
CYCLONE_DOMAIN=${CYCLONE_DOMAIN:-0}
TMP_BASE=${TMP_BASE:-${TMPDIR:-/tmp}}

# --- Cyclone DDS: install when missing ------------------------------------
if ! command -v ddsperf >/dev/null; then
  if [ "$(id -u)" -eq 0 ]; then SUDO=""
  elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then SUDO=sudo
  else
    echo "ddsperf is missing and cyclonedds-tools cannot be installed: run as root or with passwordless sudo (apt-get install cyclonedds-tools)" >&2
    exit 2
  fi
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q cyclonedds-tools
  command -v ddsperf >/dev/null || { echo "apt-get installed cyclonedds-tools but ddsperf is still not on PATH" >&2; exit 2; }
fi
cyclone_version=$(dpkg-query -W -f='${Version}' cyclonedds-tools 2>/dev/null || echo unknown)

# Loopback only: lo, no multicast, unicast discovery to 127.0.0.1 (with
# ParticipantIndex auto, so that the peer's discovery port can be probed).
export CYCLONEDDS_URI='<General><Interfaces><NetworkInterface name="lo"/></Interfaces><AllowMulticast>false</AllowMulticast></General><Discovery><ParticipantIndex>auto</ParticipantIndex><Peers><Peer address="127.0.0.1"/></Peers></Discovery>'

# --- Spindle ----------------------------------------------------------------
if [ -n "${SPINDLE_BIN:-}" ]; then
  bin=$SPINDLE_BIN
else
  cargo build --release -q -p spindle-cli
  bin=${CARGO_TARGET_DIR:-target}/release/spindle
fi
[ -x "$bin" ] || { echo "no spindle binary at $bin" >&2; exit 2; }
bin=$(realpath "$bin")

work=$(mktemp -d -p "$TMP_BASE" cyclone-peer.XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]:-}"; do [ -n "$p" ] && kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

# taskset prefixes (empty when --cpus "" turns pinning off).
pin_a=(); pin_b=()
[ -n "$CPU_A" ] && pin_a=(taskset -c "$CPU_A")
[ -n "$CPU_B" ] && pin_b=(taskset -c "$CPU_B")
pin_txt() { if [ -n "$1" ]; then echo "taskset -c $1 "; fi; }

load_start=$(cut -d" " -f1-3 /proc/loadavg)
manifest=$work/manifest.tsv
: > "$manifest"
record() { # stack test transport size fileA fileB command error
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$@" >> "$manifest"
}

# Wait for a pair of processes; on failure print their logs, set $failure
# (their last lines, for the JSON) and count it: the other runs go on.
failures=0
wait_pair() { # label pidA logA pidB logB
  local rc_a=0 rc_b=0
  wait "$2" || rc_a=$?
  wait "$4" || rc_b=$?
  pids=()
  failure=""
  if [ $rc_a -ne 0 ] || [ $rc_b -ne 0 ]; then
    failure="exit $rc_a and $rc_b (124 = timed out): $({ echo "first:"; tail -n 3 "$3"; echo "second:"; tail -n 3 "$5"; } | grep -v '^$' | tr '\t\n' '  ')"
    echo "$1 FAILED, $failure" >&2
    failures=$((failures + 1))
  fi
}

# ddsperf: the second process starts first and outlives the first. ping
# runs S+2 s: its first line comes at 2 s (discovery) and is dropped, S
# seconds follow. pub runs S+1 s: sub's first and last (partial) seconds
# are dropped, S seconds remain.
cyclone() { # test(latency|throughput) size
  local size=$2 a b la lb ca cb
  la=$work/cyclone-$1-$size-a.log; lb=$work/cyclone-$1-$size-b.log
  if [ "$1" = latency ]; then
    ca=(ddsperf -i "$CYCLONE_DOMAIN" -D $((run_s + 2)) ping size "$size")
    cb=(ddsperf -i "$CYCLONE_DOMAIN" -D $((run_s + 4)) pong)
  else
    ca=(ddsperf -i "$CYCLONE_DOMAIN" -D $((run_s + 1)) pub size "$size")
    cb=(ddsperf -i "$CYCLONE_DOMAIN" -D $((run_s + 3)) sub)
  fi
  timeout $((run_s + 30)) ${pin_b[@]+"${pin_b[@]}"} "${cb[@]}" > "$lb" 2>&1 & b=$!; pids+=("$b")
  sleep 0.2
  timeout $((run_s + 30)) ${pin_a[@]+"${pin_a[@]}"} "${ca[@]}" > "$la" 2>&1 & a=$!; pids+=("$a")
  wait_pair "cyclone $1 $size B" "$a" "$la" "$b" "$lb"
  record cyclone "$1" udp "$size" "$la" "$lb" "CYCLONEDDS_URI=<see cyclone_uri> $(pin_txt "$CPU_B")${cb[*]} & $(pin_txt "$CPU_A")${ca[*]}" "$failure"
}

spindle_domain=$((1000 + $$ % 1000 * 10))
spindle() { # test(latency|throughput) transport size
  local test=$1 transport=$2 size=$3 ra rb pa pb la lb a b extra=()
  if [ "$test" = latency ]; then ra=ping; rb=pong; else ra=pub; rb=sub; fi
  spindle_domain=$((spindle_domain + 1))
  if [ "$transport" = tcp ]; then
    local ports key=$work/domain.key
    ports=$(python3 -c 'import socket
s=[socket.socket() for _ in range(2)]
[x.bind(("127.0.0.1",0)) for x in s]
print(",".join("127.0.0.1:%d" % x.getsockname()[1] for x in s))')
    printf 'spindle-dds-perf-key-0123456789' > "$key"
    extra=(--transport tcp --peers "$ports" --key-file "$key")
  fi
  pa=$work/spindle-$test-$transport-$size-a.json; pb=$work/spindle-$test-$transport-$size-b.json
  la=$work/spindle-$test-$transport-$size-a.log; lb=$work/spindle-$test-$transport-$size-b.log
  # shellcheck disable=SC2206 # SPINDLE_EXTRA is a list of flags
  local common=(--size "$size" --seconds "$run_s" --domain "$spindle_domain" "${extra[@]}" ${SPINDLE_EXTRA:-})
  timeout $((run_s + 90)) ${pin_a[@]+"${pin_a[@]}"} \
    "$bin" dds perf $ra --rank 0 --part-file "$pa" "${common[@]}" > "$la" 2>&1 & a=$!; pids+=("$a")
  timeout $((run_s + 90)) ${pin_b[@]+"${pin_b[@]}"} \
    "$bin" dds perf $rb --rank 1 --part-file "$pb" "${common[@]}" > "$lb" 2>&1 & b=$!; pids+=("$b")
  wait_pair "spindle $test $transport $size B" "$a" "$la" "$b" "$lb"
  record spindle "$test" "$transport" "$size" "$pa" "$pb" \
    "$(pin_txt "$CPU_A")spindle dds perf $ra --rank 0 ${common[*]} & $(pin_txt "$CPU_B")spindle dds perf $rb --rank 1 ${common[*]}" "$failure"
}

for size in $sizes; do
  echo "== $size B: latency (ping/pong, ${run_s} s each)" >&2
  cyclone latency "$size"
  spindle latency tcp "$size"
  spindle latency shm "$size"
  echo "== $size B: throughput (pub/sub, ${run_s} s each)" >&2
  cyclone throughput "$size"
  spindle throughput tcp "$size"
  spindle throughput shm "$size"
done

mkdir -p "$(dirname "$out")"
python3 bench/peers/cyclonedds-summary.py "$manifest" "$out" \
  --seconds "$run_s" --cpus "$cpus" --cyclone-version "$cyclone_version" \
  --cyclone-uri "$CYCLONEDDS_URI" --spindle-version "$(git rev-parse --short HEAD 2>/dev/null || echo unknown)" \
  --spindle-extra "${SPINDLE_EXTRA:-}" --load-start "$load_start"
if [ "$failures" -gt 0 ]; then
  echo "$failures run(s) failed: see \"error\" in $out" >&2
  exit 1
fi
