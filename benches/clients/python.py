"""idem's Python package (the engine in-process) beside AWS Lambda
Powertools' idempotency utility, both on one Redis, in one run, with
redis-py doing the raw work (SET NX, then SET) as the anchor. Run by
`scripts/bench-clients`, which starts the Redis server.

Each round calls, one library after the other, for SECONDS each:
- unique keys: every call runs the function (claim, run, complete);
- replays: every call asks again for one of 1,000 keys completed before.
at 1 caller and at 8 threads. Prints one line per measurement:
`<case> <callers> <library> <ops/s> <p50 µs> <p99 µs> <client CPU µs/op>`.

Usage: python python.py REDIS_PORT SECONDS ROUNDS
"""

from __future__ import annotations

import sys
import threading
import time
import uuid
import warnings

import redis
from aws_lambda_powertools.utilities.idempotency import IdempotencyConfig, idempotent_function
from aws_lambda_powertools.utilities.idempotency.persistence.redis import RedisCachePersistenceLayer
from idem_engine import Idem

warnings.simplefilter("ignore")
port = int(sys.argv[1])
seconds, rounds = float(sys.argv[2]), int(sys.argv[3])
REPLAY_KEYS = 1000
RESULT = {"ok": True, "charge": "ch_1"}


def powertools():
    layer = RedisCachePersistenceLayer(host="127.0.0.1", port=port, ssl=False)
    config = IdempotencyConfig(event_key_jmespath="order_id", expires_after_seconds=3600)

    @idempotent_function(data_keyword_argument="order", persistence_store=layer, config=config)
    def charge(order):
        return RESULT

    return lambda key: charge(order={"order_id": key})


def idem():
    client = Idem(f"redis://127.0.0.1:{port}", retention=3600)

    @client.idempotent(scope="bench", key="order_id")
    def charge(order_id):
        return RESULT

    return charge


def raw():
    """What the store itself must do per call: claim with SET NX and a
    lease, then store the result (a replay: one GET)."""
    local = threading.local()

    def call(key):
        r = getattr(local, "r", None)
        if r is None:
            r = local.r = redis.Redis(host="127.0.0.1", port=port)
        k = f"raw:{key}"
        if r.set(k, b"in_progress", nx=True, px=30_000):
            r.set(k, b'{"ok":true,"charge":"ch_1"}', px=3_600_000)
            return RESULT
        return r.get(k)

    return call


def measure(call, keys, callers):
    """Calls `call(keys(i))` from `callers` threads for `seconds`."""
    latencies: list[list[float]] = [[] for _ in range(callers)]
    start_cpu, start = time.process_time(), time.monotonic()
    deadline = start + seconds

    def work(n):
        mine, i = latencies[n], n
        while time.monotonic() < deadline:
            t = time.perf_counter()
            call(keys(i))
            mine.append(time.perf_counter() - t)
            i += callers

    threads = [threading.Thread(target=work, args=(n,)) for n in range(callers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed, cpu = time.monotonic() - start, time.process_time() - start_cpu
    all_ = sorted(x for per in latencies for x in per)
    ops = len(all_)
    return (
        ops / elapsed,
        all_[ops // 2] * 1e6,
        all_[min(ops - 1, ops * 99 // 100)] * 1e6,
        cpu / ops * 1e6,
    )


libraries = {"powertools": powertools(), "idem": idem(), "raw redis": raw()}
for round_ in range(rounds):
    for callers in (1, 8):
        for name, call in libraries.items():
            run = uuid.uuid4().hex
            unique = measure(call, lambda i: f"{run}-u{i}", callers)
            for i in range(REPLAY_KEYS):
                call(f"{run}-r{i}")
            replays = measure(call, lambda i: f"{run}-r{(i * 7919) % REPLAY_KEYS}", callers)
            for case, m in (("unique", unique), ("replays", replays)):
                print(f"{case} {callers} {name.replace(' ', '_')} "
                      f"{m[0]:.0f} {m[1]:.0f} {m[2]:.0f} {m[3]:.1f}", flush=True)
