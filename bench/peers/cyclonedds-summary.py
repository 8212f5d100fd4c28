#!/usr/bin/env python3
"""Summarize bench/peers/cyclonedds-ddsperf.sh's runs into one JSON file and
print a table.

Input: a manifest (tab-separated: stack, test, transport, size, file A,
file B, command) naming ddsperf logs (Cyclone) and `spindle dds perf`
part files (Spindle).

Cyclone (ddsperf 0.10, its text output):
  ping:  "[pid] T  host:pid size S mean Mus min Mus 50% Mus 90% Mus 99% Mus
          max Mus cnt N", one line a second, percentiles of that second's
          first 20000 samples. ddsperf records HALF the round trip
          ((t_now - t_ping) / 2); we double it so that both stacks report
          the round trip. Over the run: the count-weighted mean of the
          per-second p50 and p99 (ddsperf prints no whole-run percentiles);
          the mean is exact. The first second (discovery, start-up) is
          dropped when there are more.
  sub:   "[pid] T  size S total N lost L delta D lost L rate X kS/s Y Mb/s
          (…)", one line a second. Throughput: the samples of every second
          but the first and the last (partial: the publisher starts and
          stops inside them) over those seconds' span.
Spindle (`spindle dds perf ping|pub|pong|sub --part-file`), merged the way
`spindle dds perf pair` merges them: round-trip percentiles of the ping
role (hdrhistogram over the whole run); throughput = samples taken by sub
over the span between its first and last sample.
Mb/s for both = samples/s × size × 8 / 1e6 (the nominal size: ddsperf's
"size S" is its KeyedSeq payload including the 12-byte fixed part,
Spindle's --size the serialized sample).
"""
import argparse
import datetime
import json
import os
import platform
import re
import sys

PING_RE = re.compile(
    r"^\[\d+\]\s+(?P<t>[\d.]+)\s+\S+\s+size (?P<size>\d+) mean (?P<mean>[\d.]+)us "
    r"min (?P<min>[\d.]+)us 50% (?P<p50>[\d.]+)us 90% (?P<p90>[\d.]+)us "
    r"99% (?P<p99>[\d.]+)us max (?P<max>[\d.]+)us cnt (?P<cnt>\d+)\s*$"
)
SUB_RE = re.compile(
    r"^\[\d+\]\s+(?P<t>[\d.]+)\s+size (?P<size>\d+) total (?P<total>\d+) lost (?P<lost_total>\d+) "
    r"delta (?P<delta>\d+) lost (?P<lost>\d+) rate (?P<ksps>[\d.]+) kS/s (?P<mbps>[\d.]+) Mb/s"
)


def fail(msg):
    print(f"cyclonedds-summary: {msg}", file=sys.stderr)
    sys.exit(1)


def cyclone_latency(log):
    lines = [m.groupdict() for m in map(PING_RE.match, open(log, encoding="utf-8", errors="replace")) if m]
    if not lines:
        fail(f"no ping statistics in {log}: is ddsperf's output format different?")
    if len(lines) > 1:
        kept, span = lines[1:], float(lines[-1]["t"]) - float(lines[0]["t"])
    else:
        kept, span = lines, 1.0
    cnt = sum(int(x["cnt"]) for x in kept)
    wavg = lambda k: sum(float(x[k]) * int(x["cnt"]) for x in kept) / cnt
    # ddsperf prints (t_now - t_ping) / 2: × 2 for the round trip.
    return {
        "latency_rtt_us": {
            "p50": 2 * wavg("p50"),
            "p99": 2 * wavg("p99"),
            "mean": 2 * wavg("mean"),
            "max": 2 * max(float(x["max"]) for x in kept),
        },
        "roundtrips": cnt,
        "roundtrips_per_s": cnt / span if span > 0 else None,
        "seconds_used": len(kept),
        "per_second_half_rtt_us": [
            {k: float(x[k]) for k in ("t", "p50", "p99", "mean")} | {"cnt": int(x["cnt"])} for x in lines
        ],
    }


def cyclone_throughput(log, size):
    lines = [m.groupdict() for m in map(SUB_RE.match, open(log, encoding="utf-8", errors="replace")) if m]
    if not lines:
        fail(f"no sub statistics in {log}: is ddsperf's output format different?")
    if len(lines) >= 3:
        kept, before = lines[1:-1], lines[0]
        samples = sum(int(x["delta"]) for x in kept)
        span = float(kept[-1]["t"]) - float(before["t"])
    else:
        kept = lines
        samples = sum(int(x["delta"]) for x in kept)
        span = float(kept[-1]["t"]) - float(kept[0]["t"]) + 1.0
    sps = samples / span
    return {
        "samples_per_s": sps,
        "mbps": sps * size * 8 / 1e6,
        "samples_counted": samples,
        "seconds_used": round(span, 3),
        "received_total": int(lines[-1]["total"]),
        "lost_total": int(lines[-1]["lost_total"]),
        "per_second": [{"t": float(x["t"]), "samples": int(x["delta"]), "kS_per_s": float(x["ksps"])} for x in lines],
    }


def spindle_latency(part_a):
    p = json.load(open(part_a))
    lat = p["latency_ns"]
    if not p["received"]:
        fail(f"spindle ping got no echo ({part_a})")
    return {
        "latency_rtt_us": {"p50": lat["p50"] / 1e3, "p99": lat["p99"] / 1e3, "p999": lat["p999"] / 1e3, "max": lat["max"] / 1e3},
        "roundtrips": p["received"],
        "written": p["written"],
    }


def spindle_throughput(part_a, part_b, size):
    w, r = json.load(open(part_a)), json.load(open(part_b))
    span = max(r["received_span_s"], 1e-9)
    if not r["received"]:
        fail(f"spindle sub took nothing ({part_b})")
    sps = r["received"] / span
    return {
        "samples_per_s": sps,
        "mbps": sps * size * 8 / 1e6,
        "mbps_serialized": r["received_bytes"] * 8 / span / 1e6,
        "received": r["received"],
        "written": w["written"],
        "writes_blocked": w["writes_blocked"],
        "seconds_used": round(span, 3),
        "one_way_latency_us_under_load": {"p50": r["latency_ns"]["p50"] / 1e3, "p99": r["latency_ns"]["p99"] / 1e3},
    }


def machine():
    model = "unknown"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpu_model": model, "cores": os.cpu_count(), "kernel": platform.release()}


def ratio(a, b):
    return a / b if a is not None and b else None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("manifest")
    ap.add_argument("out")
    ap.add_argument("--seconds", type=float, required=True)
    ap.add_argument("--cpus", default="")
    ap.add_argument("--cyclone-version", default="unknown")
    ap.add_argument("--cyclone-uri", default="")
    ap.add_argument("--spindle-version", default="unknown")
    ap.add_argument("--spindle-extra", default="")
    ap.add_argument("--load-start", default="")
    a = ap.parse_args()

    by_size, commands = {}, []
    for row in open(a.manifest):
        stack, test, transport, size, fa, fb, cmd, error = row.rstrip("\n").split("\t")
        size = int(size)
        commands.append(cmd)
        d = by_size.setdefault(size, {"size_bytes": size})
        key = "cyclone" if stack == "cyclone" else f"spindle_{transport}"
        entry = d.setdefault(key, {"transport": "udp (lo)" if stack == "cyclone" else f"{transport} (127.0.0.1)" if transport == "tcp" else "shm"})
        if error:
            entry["latency" if test == "latency" else "throughput"] = {"error": error}
        elif stack == "cyclone":
            entry["latency" if test == "latency" else "throughput"] = (
                cyclone_latency(fa) if test == "latency" else cyclone_throughput(fb, size)
            )
        else:
            entry["latency" if test == "latency" else "throughput"] = (
                spindle_latency(fa) if test == "latency" else spindle_throughput(fa, fb, size)
            )

    sizes = []
    for size in sorted(by_size):
        d = by_size[size]
        cyc = d.get("cyclone", {})
        d["ratios_spindle_over_cyclone"] = {}
        d["goal"] = {}
        for t in ("tcp", "shm"):
            sp = d.get(f"spindle_{t}")
            if not sp or not cyc:
                continue
            cl, sl = cyc.get("latency", {}).get("latency_rtt_us", {}), sp.get("latency", {}).get("latency_rtt_us", {})
            ct, st = cyc.get("throughput", {}), sp.get("throughput", {})
            r = {
                "latency_p50": ratio(sl.get("p50"), cl.get("p50")),
                "latency_p99": ratio(sl.get("p99"), cl.get("p99")),
                "throughput_samples_per_s": ratio(st.get("samples_per_s"), ct.get("samples_per_s")),
            }
            d["ratios_spindle_over_cyclone"][t] = r
            d["goal"][t] = {
                "latency_p50_at_most_0.5x": r["latency_p50"] is not None and r["latency_p50"] <= 0.5,
                "latency_p99_at_most_0.5x": r["latency_p99"] is not None and r["latency_p99"] <= 0.5,
                "throughput_at_least_2x": r["throughput_samples_per_s"] is not None and r["throughput_samples_per_s"] >= 2.0,
            }
        sizes.append(d)

    cpu_a, _, cpu_b = a.cpus.partition(",")
    result = {
        "what": "Spindle DDS (spindle dds perf) vs Cyclone DDS (ddsperf), one host, loopback only; issue 14's goal: "
        "spindle/cyclone latency <= 0.5 and throughput >= 2 for 16 B, 1 KB, 10 KB",
        "generated_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "seconds_per_run": a.seconds,
        "latency_unit": "microseconds, ROUND TRIP (ping -> pong -> ping); ddsperf prints half the round trip, doubled here",
        "latency_method": {
            "cyclone": "count-weighted mean of ddsperf's per-second percentiles (first second dropped), x2",
            "spindle": "hdrhistogram of every round trip of the run (the ping role)",
        },
        "throughput_method": {
            "cyclone": "sub's samples in every second but the first and last, over their span",
            "spindle": "sub's samples over the span between its first and last sample (as `spindle dds perf pair`)",
            "mbps": "samples/s x size x 8 / 1e6 for both",
        },
        "qos": "reliable, keep-all data (ddsperf defaults; its ping/pong is keep-last-1), saturating load, NAPA on (Spindle default)",
        "cpu_placement": {
            "ping_or_pub_process": f"taskset -c {cpu_a}" if cpu_a else "unpinned",
            "pong_or_sub_process": f"taskset -c {cpu_b}" if cpu_b else "unpinned",
        },
        "machine": machine(),
        "load_average": {"at_start": a.load_start, "at_end": " ".join(open("/proc/loadavg").read().split()[:3])},
        "cyclone": {"package": f"cyclonedds-tools {a.cyclone_version}", "CYCLONEDDS_URI": a.cyclone_uri},
        "spindle": {"commit": a.spindle_version, "extra_flags": a.spindle_extra},
        "sizes": sizes,
        "commands": commands,
    }
    with open(a.out, "w") as f:
        json.dump(result, f, indent=2)
        f.write("\n")

    def fmt(v, spec):
        width = int(re.match(r"\d+", spec).group())
        return format(v, spec) if isinstance(v, (int, float)) else "-".rjust(width)

    print(f"\nround-trip latency µs (p50 / p99) and throughput samples/s, {a.seconds:g} s a run, cpus {a.cpus or 'unpinned'}")
    print(f"{'size':>6} {'stack':<14} {'rtt p50':>9} {'rtt p99':>9} {'samples/s':>11} {'Mb/s':>8} {'lat p50 ×':>10} {'lat p99 ×':>10} {'thr ×':>7}")
    for d in sizes:
        for key in ("cyclone", "spindle_tcp", "spindle_shm"):
            e = d.get(key)
            if not e:
                continue
            lat = e.get("latency", {}).get("latency_rtt_us", {})
            thr = e.get("throughput", {})
            r = d["ratios_spindle_over_cyclone"].get(key.removeprefix("spindle_"), {}) if key != "cyclone" else {}
            print(
                f"{d['size_bytes']:>6} {key:<14} {fmt(lat.get('p50'), '9.1f')} {fmt(lat.get('p99'), '9.1f')} "
                f"{fmt(thr.get('samples_per_s'), '11.0f')} {fmt(thr.get('mbps'), '8.1f')} "
                f"{fmt(r.get('latency_p50'), '10.2f')} {fmt(r.get('latency_p99'), '10.2f')} {fmt(r.get('throughput_samples_per_s'), '7.2f')}"
            )
    print(f"(× = spindle / cyclone; goal: latency ≤ 0.50, throughput ≥ 2.00)  → {a.out}")


if __name__ == "__main__":
    main()
