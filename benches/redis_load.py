#!/usr/bin/env python3
"""Sends one decision's Redis traffic per request to a Redis, for
benches/redis_instructions.sh: identities drawn uniformly or by a Zipf law
from a seeded generator (the same calls on every run), and the clock
simulated (each decision 1/RATE s after the previous), so that what Redis
does per call does not depend on how fast it runs, under valgrind or not.

Usage: redis_load.py PORT PATTERN FIRST COUNT [options]
  PATTERN  ALGORITHM SHA: Sluice's decide.lua (EVALSHA SHA) with the
           arguments the store sends for one descriptor of one limit,
           `now` passed (the store's local time mode; Redis TIME costs one
           more call); ALGORITHM is one of LIMITS below
           function NAME: the same decision as `sliding` by FCALL of the
           library benches/decide_function_prototype.py makes
           batch SHA | fixed-batch SHA | bucket-batch SHA: the store's
           batch.lua, each connection's PIPELINE decisions in one call, a
           run of one request per key (the sliding, fixed window or token
           bucket limit)
           incumbent: envoyproxy/ratelimit's per-descriptor pattern,
           INCRBY key 1 and EXPIRE key 3600, pipelined together
  FIRST    the first decision's number (decisions before it were sent by
           an earlier run: its warm-up), COUNT how many to send
  --keys N (100000) --zipf S (uniform when absent) --rate R (27500/s)
  --connections C (4) --pipeline P (8 decisions in flight per connection)
"""

import argparse
import bisect
import random
import socket
import struct

HOUR = 3_600_000
# Each algorithm's limit as wire.rs's limit_args sends it: requests,
# duration_ms, algorithm code, param. Windows of an hour, so that no HASH
# expires in the minutes a run under valgrind takes (the script sets TTLs by
# Redis's own clock); limits the load never fills, so every decision counts.
LIMITS = {
    # An hour in 6 s buckets: the default's operations per call (a minute
    # in 6 s buckets).
    "sliding": (1_000_000_000, HOUR, 0, 6_000),
    "fixed": (1_000_000_000, HOUR, 1, 0),
    # The burst is the limit, the default when a rule names none.
    "bucket": (1_000_000_000, HOUR, 2, 1_000_000_000),
    # A log keeps at most its limit's entries and costs more the more it
    # keeps: a limit of the size a log is configured for (docs: for small
    # limits), which the load (a few decisions per identity) never fills.
    "log": (100, HOUR, 3, 0),
    # Slots leased for an hour and never released.
    "concurrency": (1_000_000_000, HOUR, 3, 1),
}
BATCHED = {"batch": "sliding", "fixed-batch": "fixed", "bucket-batch": "bucket"}


def resp(*args):
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        a = a if isinstance(a, bytes) else str(a).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(a), a))
    return b"".join(out)


def read_reply(f):
    line = f.readline()
    kind, rest = line[:1], line[1:-2]
    if kind == b"-":
        raise SystemExit(f"Redis error: {rest.decode()}")
    if kind == b"$":
        n = int(rest)
        if n >= 0:
            f.read(n + 2)
    elif kind == b"*":
        for _ in range(max(int(rest), 0)):
            read_reply(f)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("port", type=int)
    p.add_argument("pattern", nargs="+")
    p.add_argument("--first", type=int, required=True)
    p.add_argument("--count", type=int, required=True)
    p.add_argument("--keys", type=int, default=100_000)
    p.add_argument("--zipf", type=float)
    p.add_argument("--rate", type=float, default=27_500)
    p.add_argument("--connections", type=int, default=4)
    p.add_argument("--pipeline", type=int, default=8)
    p.add_argument("--seed", type=int, default=1)
    a = p.parse_args()

    rng = random.Random(a.seed)
    if a.zipf:
        weights, total = [], 0.0
        for k in range(1, a.keys + 1):
            total += 1 / k**a.zipf
            weights.append(total)
        draw = lambda: bisect.bisect_left(weights, rng.random() * total)
    else:
        draw = lambda: rng.randrange(a.keys)
    # The draws before FIRST were the warm-up's: skip them.
    for _ in range(a.first):
        draw()
    # A fixed epoch, 2 s before a bucket's start: the same buckets on every
    # run, and the counted decisions find some identities last seen in the
    # bucket before.
    t0 = 1_800_000_000_000 - 2_000

    def calls(n):
        # The key Sluice makes for domain "bench", user_id=<12 digits>
        # (src/limiter/key.rs: each part's tag, '0' + its length, its text).
        key = b"sluice:{d5benchk7user_idv<%012d}" % draw()
        if a.pattern[0] == "incumbent":
            return resp("INCRBY", key, 1) + resp("EXPIRE", key, 3600), 2
        now = t0 + int(n * 1000 / a.rate)
        name = a.pattern[0]
        limit = LIMITS[BATCHED.get(name, "sliding" if name == "function" else name)]
        if name in BATCHED:
            return (key, now, limit), 1
        if name == "function":
            return resp("FCALL", "sluice_decide", 1, key, now, "all", 0, 1, 1, *limit), 1
        return resp("EVALSHA", a.pattern[1], 1, key, now, "all", 0, 1, 1, *limit), 1

    conns = [socket.create_connection(("127.0.0.1", a.port)) for _ in range(a.connections)]
    files = [c.makefile("rb") for c in conns]
    n, end = a.first, a.first + a.count
    # Round after round, each connection carries up to PIPELINE decisions:
    # sent together, answered together.
    while n < end:
        pending = []
        for c, f in zip(conns, files):
            batch, replies = [], 0
            while len(batch) < a.pipeline and n < end:
                data, r = calls(n)
                batch.append(data)
                replies += r
                n += 1
            if batch and a.pattern[0] in BATCHED:
                # One call carrying them all, as the store sends batch.lua:
                # now, the algorithm codes, the one limit, then the runs
                # packed (little-endian doubles): per key the
                # limit's number, one request and its weight; and
                # the reply's format (five values per key).
                keys = [key for key, _, _ in batch]
                _, now, limit = batch[0]
                runs = struct.pack("<%dd" % (3 * len(keys)), *[1] * (3 * len(keys)))
                formats = "<" + "d" * (5 * len(keys))
                code = str(limit[2])
                c.sendall(resp("EVALSHA", a.pattern[1], len(keys), *keys, now, code, 1, *limit, runs, formats))
                pending.append((f, 1))
            elif batch:
                c.sendall(b"".join(batch))
                pending.append((f, replies))
        for f, replies in pending:
            for _ in range(replies):
                read_reply(f)


if __name__ == "__main__":
    main()
