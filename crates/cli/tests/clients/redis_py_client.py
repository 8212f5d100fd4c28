"""redis-py (the newest from PyPI: `pip install redis`) against `spindle kv serve`.

Usage: python3 redis_py_client.py PORT
Runs the same checks with the library's default protocol, RESP2 and RESP3
(HELLO 3), and exits non-zero with the first mismatch.
"""

import sys

import redis


def check(what, got, want):
    if got != want:
        sys.exit(f"redis-py {redis.__version__}: {what}: got {got!r}, want {want!r}")


def session(port, protocol):
    kwargs = {} if protocol is None else {"protocol": protocol}
    r = redis.Redis(host="127.0.0.1", port=port, decode_responses=True, client_name="spindle-test", **kwargs)
    tag = f"py{protocol}:"
    check("PING", r.ping(), True)
    check("SET", r.set(tag + "a", "1"), True)
    check("GET", r.get(tag + "a"), "1")
    check("GET missing", r.get(tag + "missing"), None)
    check("INCRBY", r.incrby(tag + "a", 41), 42)
    check("DECR", r.decr(tag + "a"), 41)
    check("APPEND", r.append(tag + "a", "x"), 3)
    check("STRLEN", r.strlen(tag + "a"), 3)
    check("SETNX", r.setnx(tag + "a", "no"), False)
    check("SET NX", r.set(tag + "a", "no", nx=True), None)
    check("SET XX GET", r.set(tag + "a", "new", xx=True, get=True), "41x")
    check("GETSET", r.getset(tag + "a", "newer"), "new")
    check("SET EX", r.set(tag + "t", "v", ex=100), True)
    ttl = r.ttl(tag + "t")
    check("TTL in (90, 100]", 90 < ttl <= 100, True)
    check("PEXPIRE", r.pexpire(tag + "t", 50_000), True)
    check("PTTL in (40000, 50000]", 40_000 < r.pttl(tag + "t") <= 50_000, True)
    check("PERSIST", r.persist(tag + "t"), True)
    check("TTL after PERSIST", r.ttl(tag + "t"), -1)
    check("EXPIRE missing", r.expire(tag + "missing", 10), False)
    check("MSET", r.mset({tag + "m1": "x", tag + "m2": "y"}), True)
    check("MGET", r.mget(tag + "m1", tag + "m2", tag + "m3"), ["x", "y", None])
    check("KEYS", sorted(r.keys(tag + "m*")), [tag + "m1", tag + "m2"])
    check("SCAN", sorted(r.scan_iter(match=tag + "*", count=2)), sorted([tag + k for k in ["a", "t", "m1", "m2"]]))
    check("EXISTS", r.exists(tag + "a", tag + "m1", tag + "nope"), 2)
    check("TYPE", r.type(tag + "a"), "string")
    pipe = r.pipeline(transaction=False)
    for _ in range(100):
        pipe.incr(tag + "p")
    check("pipeline", pipe.execute()[-1], 100)
    check("DEL of many keys", r.delete(tag + "m1", tag + "m2", tag + "nope"), 2)
    check("UNLINK", r.unlink(tag + "p"), 1)
    check("CLIENT ID is an integer", isinstance(r.client_id(), int), True)
    check("CLIENT GETNAME", r.client_getname(), "spindle-test")
    check("SELECT 0", r.execute_command("SELECT", 0), True)
    info = r.info()
    check("INFO server_name", info.get("server_name"), "spindle")
    check("INFO lists the commands", "hello" in str(info.get("redis_commands")), True)
    try:
        r.lpush(tag + "l", "1")
        sys.exit("LPUSH did not fail")
    except redis.ResponseError as e:
        check("unknown command", "unknown command" in str(e), True)
    r.close()


def main():
    port = int(sys.argv[1])
    major = int(redis.__version__.split(".")[0])
    if major < 5:
        sys.exit(f"redis-py {redis.__version__} is too old: install the newest (pip install -U redis)")
    for protocol in (None, 2, 3):
        session(port, protocol)
    r = redis.Redis(host="127.0.0.1", port=port)
    check("FLUSHDB", r.flushdb(), True)
    check("DBSIZE after FLUSHDB", r.dbsize(), 0)
    print(f"redis-py {redis.__version__}: all checks passed")


main()
