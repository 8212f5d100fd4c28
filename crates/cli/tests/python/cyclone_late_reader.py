"""A late-joining Cyclone DDS reader (Python `cyclonedds` from PyPI):
reliable, transient-local, keep-all, of ddsperf's KeyedSeq on topic
DDSPerfRDataKS. Started after a Spindle writer wrote its samples; it must
get that history. Prints one JSON line: samples, keys, in_order (every
key's seq rose by one from 0), sizes (the distinct serialized sizes as
ddsperf counts them: 12 + len(baggage)).

    python cyclone_late_reader.py DOMAIN EXPECTED TIMEOUT_S

CYCLONEDDS_URI keeps Cyclone on loopback (the test sets it).
"""

import json
import sys
import time
from dataclasses import dataclass

from cyclonedds.core import Qos, Policy
from cyclonedds.domain import DomainParticipant
from cyclonedds.idl import IdlStruct
from cyclonedds.idl.annotations import key
from cyclonedds.idl.types import sequence, uint8, uint32
from cyclonedds.sub import DataReader
from cyclonedds.topic import Topic
from cyclonedds.util import duration


@dataclass
class KeyedSeq(IdlStruct, typename="KeyedSeq"):
    seq: uint32
    keyval: uint32
    key("keyval")
    baggage: sequence[uint8]


def main() -> int:
    domain, expected, timeout_s = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
    qos = Qos(
        Policy.Reliability.Reliable(duration(seconds=1)),
        Policy.Durability.TransientLocal,
        Policy.History.KeepAll,
    )
    participant = DomainParticipant(domain)
    topic = Topic(participant, "DDSPerfRDataKS", KeyedSeq, qos=qos)
    reader = DataReader(participant, topic, qos=qos)
    next_seq = {}
    in_order = True
    samples = 0
    sizes = set()
    deadline = time.monotonic() + timeout_s
    while samples < expected and time.monotonic() < deadline:
        got = reader.take(N=1000)
        if not got:
            time.sleep(0.01)
            continue
        for s in got:
            want = next_seq.get(s.keyval, 0)
            if s.seq != want:
                in_order = False
            next_seq[s.keyval] = s.seq + 1
            sizes.add(12 + len(s.baggage))
            samples += 1
    print(json.dumps({"samples": samples, "keys": len(next_seq), "in_order": in_order, "sizes": sorted(sizes)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
