"""Several worker processes handle every key several times over while
workers are SIGKILLed mid-handler and started again, on each store
(SQLite shared by the processes, Redis, idem serve); afterwards every key
is completed once, by the holder whose fenced effect the downstream keeps,
and every re-execution is a takeover of a killed holder's claim."""

from __future__ import annotations

import collections
import random
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

from idem_engine import Idem

WORKERS = 4
KEYS = 120
COPIES = 2
KILLS = 6


def start_worker(store, ledger: Path, downstream: Path, seed: int) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(Path(__file__).parent / "worker.py"), store.url,
         store.options.get("token", ""), str(ledger), str(downstream), str(KEYS), str(COPIES),
         str(seed)],
    )


def last_line_of(ledger: Path, pid: int) -> str:
    mine = [line for line in ledger.read_text().splitlines() if line.startswith(f"{pid} ")]
    return mine[-1] if mine else ""


def test_workers_killed_mid_handler_leave_every_key_done_once(store, tmp_path):
    ledger, downstream = tmp_path / "ledger", tmp_path / "downstream.db"
    with sqlite3.connect(downstream) as db:
        db.execute("PRAGMA journal_mode = WAL")
        db.execute("CREATE TABLE effects (key TEXT PRIMARY KEY, fence INTEGER, writer INTEGER)")
    ledger.touch()
    rng = random.Random(7)
    workers = [start_worker(store, ledger, downstream, seed) for seed in range(WORKERS)]
    kills = 0
    try:
        deadline = time.monotonic() + 60
        while kills < KILLS and time.monotonic() < deadline:
            if all(p.poll() is not None for p in workers):
                break
            victim = rng.randrange(WORKERS)
            process = workers[victim]
            if process.poll() is not None:
                continue
            # Kill it mid-handler: after it started a key, before it said done.
            while time.monotonic() < deadline and process.poll() is None:
                last = last_line_of(ledger, process.pid).split(" ")
                if len(last) > 1 and last[1] in ("start", "effect"):
                    process.kill()
                    process.wait()
                    kills += 1
                    break
                time.sleep(0.002)
            workers[victim] = start_worker(store, ledger, downstream, 100 + kills)
            time.sleep(rng.uniform(0.05, 0.15))
        for process in workers:
            assert process.wait(timeout=120) == 0
    finally:
        for process in workers:
            if process.poll() is None:
                process.kill()
                process.wait()
    assert kills == KILLS

    starts = collections.defaultdict(list)
    done = collections.defaultdict(list)
    for line in ledger.read_text().splitlines():
        fields = line.split(" ")
        if fields[1] == "start":
            starts[fields[2]].append(int(fields[3]))
        elif fields[1] == "done":
            done[fields[2]].append(int(fields[3]))
    with sqlite3.connect(downstream) as db:
        effects = dict(db.execute("SELECT key, fence FROM effects"))

    idem = Idem(store.url, **store.options)
    reruns = 0
    for i in range(KEYS):
        key = f"order-{i}"
        record = idem.record("orders", key)
        assert record is not None and record["state"] == "completed", key
        stored = record["fence"]
        assert record["response"] == {"fence": stored}, key
        # The downstream keeps the completing holder's effect, and no
        # holder started after the key was completed.
        assert effects[key] == stored, key
        assert stored in starts[key] and max(starts[key]) == stored, (key, starts[key])
        # At most one completion acknowledged, and it is the stored one.
        assert done[key] in ([], [stored]), (key, done[key])
        reruns += len(starts[key]) - 1
    # Every re-execution took over a killed holder's claim: one at most per kill.
    assert 1 <= reruns <= kills, reruns
