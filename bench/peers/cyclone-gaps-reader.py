"""A Cyclone DDS reader (Python `cyclonedds` from PyPI: `python3 -m pip
install cyclonedds==11.0.1`) of ddsperf's KeyedSeq on DDSPerfRDataKS,
reliable, volatile, keep-all, that records every seq it takes and prints
one JSON line: samples, first, last, gaps (the first 20 (previous, next)
pairs where seq did not rise by one), ngaps.

    export CYCLONEDDS_URI="$(spindle dds sub --print-cyclone-uri)"
    python3 bench/peers/cyclone-gaps-reader.py DOMAIN EXPECTED TIMEOUT_S &
    spindle dds pub --rtps --loopback-only --domain DOMAIN --size 16 --count 10000

Results: bench/results/rtps-unpaced-gaps.json.
"""
import json
import os
import sys
import time

from cyclonedds.core import Qos, Policy
from cyclonedds.domain import DomainParticipant
from cyclonedds.sub import DataReader
from cyclonedds.topic import Topic
from cyclonedds.util import duration

# ddsperf's KeyedSeq, defined once, beside the interop tests' late reader.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "crates", "cli", "tests", "python"))
from cyclone_late_reader import KeyedSeq  # noqa: E402

domain, expected, timeout_s = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
qos = Qos(Policy.Reliability.Reliable(duration(seconds=1)), Policy.Durability.Volatile, Policy.History.KeepAll)
p = DomainParticipant(domain)
t = Topic(p, "DDSPerfRDataKS", KeyedSeq, qos=qos)
r = DataReader(p, t, qos=qos)
seqs = []
deadline = time.monotonic() + timeout_s
while len(seqs) < expected and time.monotonic() < deadline:
    got = r.take(N=1000)
    if not got:
        time.sleep(0.005); continue
    seqs.extend(s.seq for s in got if hasattr(s, "seq"))
gaps = []
prev = None
for s in seqs:
    if prev is not None and s != prev + 1:
        gaps.append((prev, s))
    prev = s
print(json.dumps({"samples": len(seqs), "first": seqs[:1], "last": seqs[-1:], "gaps": gaps[:20], "ngaps": len(gaps)}))
