"""The heartbeat thread on its own: a beat that fails in a way nobody
expected does not stop the others."""

from __future__ import annotations

import threading
import time

from idem_client._heartbeat import Heartbeats


def test_a_beat_that_raises_does_not_stop_the_others():
    heartbeats = Heartbeats()
    calls = []
    stop = threading.Event()

    def broken() -> bool:
        raise ValueError("a proxy answered with a page, say")

    def counting() -> bool:
        calls.append(time.monotonic())
        return True

    heartbeats.add(0.01, broken, threading.Event())
    heartbeats.add(0.01, counting, stop)
    time.sleep(0.3)
    stop.set()
    assert len(calls) >= 5
    seen = len(calls)
    time.sleep(0.1)
    assert len(calls) <= seen + 1, "a stopped beat goes on"
