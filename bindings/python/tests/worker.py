"""One worker process of test_processes: handles its deliveries (every key,
several times, shuffled), each through ``Idem.claim``, with a fenced write
to a shared downstream table as the effect. It writes what it does to a
shared ledger, one line per event, so the test can check the run after
workers are SIGKILLed mid-handler.

Usage: worker.py STORE_URL TOKEN LEDGER DOWNSTREAM KEYS COPIES SEED
"""

from __future__ import annotations

import os
import random
import sqlite3
import sys
import time

from idem_engine import Idem, InProgress, LeaseLost


def main() -> None:
    url, token, ledger_path, downstream_path = sys.argv[1:5]
    keys, copies, seed = int(sys.argv[5]), int(sys.argv[6]), int(sys.argv[7])
    rng = random.Random(seed)
    ledger = os.open(ledger_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    pid = os.getpid()

    def note(*fields: object) -> None:
        os.write(ledger, (" ".join(str(f) for f in (pid, *fields)) + "\n").encode())

    downstream = sqlite3.connect(downstream_path, timeout=30, isolation_level=None)

    def fenced_write(key: str, fence: int) -> bool:
        """The effect: applied unless a holder with a larger fence wrote."""
        downstream.execute("BEGIN IMMEDIATE")
        row = downstream.execute("SELECT fence FROM effects WHERE key = ?", (key,)).fetchone()
        if row is not None and row[0] >= fence:
            downstream.execute("ROLLBACK")
            return False
        downstream.execute(
            "INSERT INTO effects (key, fence, writer) VALUES (?, ?, ?) "
            "ON CONFLICT (key) DO UPDATE SET fence = excluded.fence, writer = excluded.writer",
            (key, fence, pid),
        )
        downstream.execute("COMMIT")
        return True

    idem = Idem(url, token=token or None, lease=1.0)
    deliveries = [f"order-{i}" for i in range(keys) for _ in range(copies)]
    rng.shuffle(deliveries)
    while deliveries:
        key = deliveries.pop(0)
        try:
            with idem.claim("orders", key, fingerprint={"order": key}) as run:
                if run.replayed:
                    note("replayed", key, run.result["fence"])
                    continue
                note("start", key, run.fence)
                time.sleep(rng.uniform(0.01, 0.04))
                applied = fenced_write(key, run.fence)
                note("effect", key, run.fence, "applied" if applied else "stale")
                time.sleep(rng.uniform(0, 0.01))
                run.complete({"fence": run.fence})
                note("done", key, run.fence)
        except InProgress as e:
            # Redelivered later, as a broker would.
            deliveries.append(key)
            time.sleep(min(e.retry_after, 0.05))
        except LeaseLost:
            # Taken over while this worker stalled: the new holder finishes
            # it; the delivery comes back and is replayed.
            note("lost", key)
            deliveries.append(key)
    note("finished")


if __name__ == "__main__":
    main()
