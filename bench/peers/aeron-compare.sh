#!/usr/bin/env bash
# Compare Spindle's ordered multicast on shm (2 members, one process each)
# with Aeron's exclusive IPC publication (one publisher thread, one
# subscriber thread, an embedded media driver: Aeron's own sample
# io.aeron.samples.EmbeddedExclusiveIpcThroughput from
# io.aeron:aeron-all:$AERON_VERSION on Maven Central), at 32 B and at 10 KB,
# in one run, alternating the two so both see the same host.
#
# Each round runs, in this order (reversed every other round):
#   Aeron 32 B | Spindle 32 B one sender | Spindle 32 B all senders |
#   Aeron 10 KB | Spindle 10 KB one sender
# and the table reports the median over the rounds, each round's figure
# beside it.
#
# Aeron's sample runs until stopped and prints a rate once a second; it runs
# for $AERON_S seconds (SIGINT), the first $AERON_WARMUP samples are dropped
# as warm-up, and so is every sample printed after the threads stopped; the
# median of the rest is its figure. Its JVM flags are those of Aeron's own
# sample scripts (bounds checks off, parallel GC, long safepoint interval).
#
# Needs java and mvn (installed from Debian's default-jdk-headless and maven
# when missing: root or sudo) and Maven Central. Run it on a quiet machine:
#   bash bench/peers/aeron-compare.sh [OUT.md]   # writes OUT.md and OUT.json
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-bench/results/aeron-compare.md}
json=${out%.md}.json
AERON_VERSION=${AERON_VERSION:-1.51.0}
ROUNDS=${ROUNDS:-5}
AERON_S=${AERON_S:-12}
AERON_WARMUP=${AERON_WARMUP:-2}
COUNT_32=${COUNT_32:-20000000}
COUNT_10K=${COUNT_10K:-500000}
# The configuration of every figure in bench/RESULTS.md: members spin, member
# r pinned to CPU r (Aeron's threads spin too; the JVM does not pin them).
SPINDLE_FLAGS=${SPINDLE_FLAGS:---idle spin --pin}
TMP_BASE=${TMP_BASE:-${TMPDIR:-/tmp}}

if ! command -v java >/dev/null || ! command -v mvn >/dev/null; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q default-jdk-headless maven
fi

# Aeron's jar, fetched once into target/aeron-peer/ by a generated pom.
peer=${CARGO_TARGET_DIR:-target}/aeron-peer
jar=$peer/lib/aeron-all-$AERON_VERSION.jar
if [ ! -f "$jar" ]; then
  mkdir -p "$peer"
  cat > "$peer/pom.xml" <<EOF
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>spindle.bench</groupId>
  <artifactId>aeron-peer</artifactId>
  <version>0</version>
  <dependencies>
    <dependency>
      <groupId>io.aeron</groupId>
      <artifactId>aeron-all</artifactId>
      <version>$AERON_VERSION</version>
    </dependency>
  </dependencies>
</project>
EOF
  (cd "$peer" && mvn -q -B dependency:copy-dependencies -DoutputDirectory=lib)
fi
test -f "$jar"

cargo build --release -q -p spindle-cli
bin=${CARGO_TARGET_DIR:-target}/release/spindle

work=$(mktemp -d -p "$TMP_BASE" aeron-compare.XXXXXX)
aeron_dir=/dev/shm/aeron-compare-$$
cleanup() { rm -rf "$work" "$aeron_dir"; }
trap cleanup EXIT

java_flags=(
  --add-opens java.base/sun.nio.ch=ALL-UNNAMED
  --add-opens java.base/jdk.internal.misc=ALL-UNNAMED
  -XX:+UnlockDiagnosticVMOptions -XX:GuaranteedSafepointInterval=300000
  -XX:+UseParallelGC -Dagrona.disable.bounds.checks=true
  -Daeron.dir="$aeron_dir" -Daeron.dir.delete.on.start=true -Daeron.dir.delete.on.shutdown=true
)
aeron_cmd="java ${java_flags[*]} -Daeron.sample.messageLength=SIZE -cp $jar io.aeron.samples.EmbeddedExclusiveIpcThroughput"

aeron() { # name size
  echo "== aeron $2 B ($AERON_S s)" >&2
  timeout -s INT -k 5 "$AERON_S" java "${java_flags[@]}" -Daeron.sample.messageLength="$2" \
    -cp "$jar" io.aeron.samples.EmbeddedExclusiveIpcThroughput > "$work/$1.txt" 2>&1 || true
  grep -q '^Duration' "$work/$1.txt" || { cat "$work/$1.txt" >&2; exit 1; }
}

spindle() { # name args...
  local name=$1; shift
  echo "== spindle bench multicast $* $SPINDLE_FLAGS" >&2
  # shellcheck disable=SC2086 # SPINDLE_FLAGS is a list of flags
  timeout 300 "$bin" bench multicast "$@" $SPINDLE_FLAGS --json "$work/$name.json" > "$work/$name.txt" 2>&1 \
    || { cat "$work/$name.txt" >&2; exit 1; }
}

round() { # r
  local r=$1
  local steps=(a32 s32one s32all a10k s10kone)
  if [ $((r % 2)) -eq 1 ]; then steps=(s32one s32all a32 s10kone a10k); fi
  for s in "${steps[@]}"; do
    case $s in
      a32) aeron "aeron-32-r$r" 32 ;;
      a10k) aeron "aeron-10k-r$r" 10240 ;;
      s32one) spindle "spindle-32-one-r$r" --members 2 --senders one --size 32 --count "$COUNT_32" ;;
      s32all) spindle "spindle-32-all-r$r" --members 2 --senders all --size 32 --count "$COUNT_32" ;;
      s10kone) spindle "spindle-10k-one-r$r" --members 2 --senders one --size 10240 --count "$COUNT_10K" ;;
    esac
    sleep 1 # let the previous run's processes and mappings go
  done
}

load_before=$(cut -d' ' -f1-3 /proc/loadavg)
for r in $(seq 0 $((ROUNDS - 1))); do round "$r"; done
load_after=$(cut -d' ' -f1-3 /proc/loadavg)

python3 - "$work" "$ROUNDS" "$AERON_WARMUP" "$out" "$json" <<PY
import json, re, statistics, sys, time, os, platform
work, rounds, warm, out, jpath = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]

def aeron(name):
    """Per-second msgs/s and payload B/s of one Aeron run (warm-up and post-stop samples dropped)."""
    msgs, byts = [], []
    for line in open(f"{work}/{name}.txt"):
        if "ratio:" in line:  # a thread stopped: later samples are the shutdown
            break
        m = re.match(r"Duration (\d+)ms - ([\d,]+) messages - ([\d,]+) payload bytes", line)
        if m:
            s = int(m[1]) / 1000
            msgs.append(int(m[2].replace(",", "")) / s)
            byts.append(int(m[3].replace(",", "")) / s)
    msgs, byts = msgs[warm:], byts[warm:]
    assert msgs, f"{name}: no samples after warm-up"
    return {"samples_msgs_per_s": msgs, "msgs_per_s": statistics.median(msgs),
            "gbps": statistics.median(byts) / 1e9}

def spindle(name):
    d = json.load(open(f"{work}/{name}.json"))
    return {"msgs_per_s": d["delivered_msgs_per_s_min"], "gbps": d["delivered_gbps_min"],
            "baseline_msgs_per_s": d["baseline_msgs_per_s"], "baseline_gbps": d["baseline_gbps"],
            "ratio_to_baseline": d["ratio_to_baseline"], "command": d["command"],
            "member_counters": [m["counters"] for m in d["member_results"]]}

runs = {k: [] for k in ["aeron-32", "spindle-32-one", "spindle-32-all", "aeron-10k", "spindle-10k-one"]}
for r in range(rounds):
    for k in runs:
        runs[k].append((aeron if k.startswith("aeron") else spindle)(f"{k}-r{r}"))

# A round is quiet when both raw rings of its Spindle runs reach at least half
# of the best of this run: the host (a shared VM) sometimes leaves these
# processes a fraction of the CPUs for seconds, and the raw ring shows it.
best32 = max(x["baseline_msgs_per_s"] for x in runs["spindle-32-one"])
best10k = max(x["baseline_gbps"] for x in runs["spindle-10k-one"])
quiet = [r for r in range(rounds) if runs["spindle-32-one"][r]["baseline_msgs_per_s"] >= best32 / 2
         and runs["spindle-10k-one"][r]["baseline_gbps"] >= best10k / 2]

def summary(rs):
    med = lambda k, f: statistics.median(runs[k][r][f] for r in rs)
    m = {"rounds": rs, "aeron_32b_msgs_per_s": med("aeron-32", "msgs_per_s"),
         "aeron_10k_gbps": med("aeron-10k", "gbps"),
         "spindle_32b_one_msgs_per_s": med("spindle-32-one", "msgs_per_s"),
         "spindle_32b_all_msgs_per_s": med("spindle-32-all", "msgs_per_s"),
         "spindle_10k_one_gbps": med("spindle-10k-one", "gbps"),
         "raw_ring_10k_gbps": med("spindle-10k-one", "baseline_gbps"),
         "raw_ring_32b_msgs_per_s": med("spindle-32-one", "baseline_msgs_per_s")}
    m["ratios"] = {"32b_one_spindle_over_aeron": m["spindle_32b_one_msgs_per_s"] / m["aeron_32b_msgs_per_s"],
                   "32b_all_spindle_over_aeron": m["spindle_32b_all_msgs_per_s"] / m["aeron_32b_msgs_per_s"],
                   "10k_one_spindle_over_aeron": m["spindle_10k_one_gbps"] / m["aeron_10k_gbps"],
                   "10k_one_spindle_over_raw_ring": m["spindle_10k_one_gbps"] / m["raw_ring_10k_gbps"]}
    return m

every, calm = summary(list(range(rounds))), summary(quiet) if quiet else None
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
machine = {"nproc": os.cpu_count(), "cpu_model": cpu, "kernel": platform.release(),
           "loadavg_before": "$load_before", "loadavg_after": "$load_after",
           "date_utc": time.strftime("%Y-%m-%dT%H:%MZ", time.gmtime())}
json.dump({"machine": machine, "rounds": rounds, "aeron_warmup_samples_dropped": warm,
           "aeron_command": "$aeron_cmd", "runs": runs, "medians_all_rounds": every,
           "medians_quiet_rounds": calm}, open(jpath, "w"), indent=1)

M = 1e6
def table(w, m):
    rs = m["rounds"]
    each = lambda k, f, scale, fmt: ", ".join(fmt.format(runs[k][r][f] / scale) for r in rs)
    a32, a10k = m["aeron_32b_msgs_per_s"], m["aeron_10k_gbps"]
    s32, s32all, s10k = m["spindle_32b_one_msgs_per_s"], m["spindle_32b_all_msgs_per_s"], m["spindle_10k_one_gbps"]
    ring32, ring10k = m["raw_ring_32b_msgs_per_s"], m["raw_ring_10k_gbps"]
    w("| measurement | Spindle | Aeron $AERON_VERSION, same rounds | Spindle / Aeron | Spindle / raw shm ring |")
    w("|---|---|---|---|---|")
    w(f"| 32 B, one sender, M msgs/s at the slowest member | **{s32/M:.1f}** ({each('spindle-32-one','msgs_per_s',M,'{:.1f}')}) "
      f"| {a32/M:.1f} ({each('aeron-32','msgs_per_s',M,'{:.1f}')}) | **{s32/a32:.2f}** | {s32/ring32:.2f} (ring {ring32/M:.0f} M/s) |")
    w(f"| 32 B, all senders, M msgs/s delivered per member | {s32all/M:.1f} ({each('spindle-32-all','msgs_per_s',M,'{:.1f}')}) "
      f"| {a32/M:.1f} (one stream) | {s32all/a32:.2f} | — |")
    w(f"| 10 KB, one sender, GB/s at the slowest member | **{s10k:.1f}** ({each('spindle-10k-one','gbps',1,'{:.1f}')}) "
      f"| {a10k:.1f} ({each('aeron-10k','gbps',1,'{:.1f}')}) | {s10k/a10k:.2f} | **{s10k/ring10k:.2f}** (ring {ring10k:.1f} GB/s) |")
    w(f"| host check: raw shm ring of each Spindle run (32 B M msgs/s; 10 KB GB/s) | "
      f"{each('spindle-32-one','baseline_msgs_per_s',M,'{:.0f}')}; {each('spindle-10k-one','baseline_gbps',1,'{:.1f}')} | | | |")

with open(out, "w") as f:
    w = lambda s="": print(s, file=f)
    w(f"# Spindle ordered multicast vs Aeron exclusive IPC ({machine['date_utc']})")
    w()
    w(f"{machine['nproc']} CPUs: {cpu}; kernel {machine['kernel']}; load average "
      f"{machine['loadavg_before']} before, {machine['loadavg_after']} after. "
      f"{rounds} rounds, Aeron and Spindle alternated; medians, each round's figure in brackets.")
    w()
    w(f"## Quiet rounds ({len(quiet)} of {rounds}: both raw rings of the round at least half the run's best)")
    w()
    if calm:
        table(w, calm)
    else:
        w("None: every round was disturbed; see all rounds.")
    w()
    w(f"## All {rounds} rounds")
    w()
    table(w, every)
    w()
    w("What each side does per message. Spindle: 2 member processes, total order, every payload byte")
    w("written by the sender (a pattern per message) and read by the other member (a checksum checked")
    w("by the coordinator). Aeron: one publisher thread and one subscriber thread in one JVM, with an")
    w("embedded media driver (shared threading mode); the publisher copies the same buffer into the")
    w("log each time and the subscriber counts lengths without reading the payload.")
    w()
    w("Commands:")
    w()
    w(f"- Spindle: \`{runs['spindle-32-one'][0]['command'].replace(f'--json {work}/spindle-32-one-r0.json', '').strip()}\`; "
      f"the same with \`--senders all\`; and \`--size 10240 --count $COUNT_10K\` one sender (each prints the raw shm ring of its run).")
    w(f"- Aeron: \`timeout -s INT $AERON_S {'$aeron_cmd'.replace(f'$jar', 'aeron-all-$AERON_VERSION.jar')}\`, SIZE 32 and 10240;")
    w(f"  rate = median of the per-second lines after the first {warm}.")
    w("- All of it: \`bash bench/peers/aeron-compare.sh\` (JSON beside this file).")
print(open(out).read())
PY
