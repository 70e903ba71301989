"""The heartbeats of a client's live runs: one daemon thread that extends
each run's lease every third of it, instead of a thread per run."""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from typing import Callable, Optional

_Entry = tuple[float, int, float, Callable[[], bool], threading.Event]


class Heartbeats:
    """Calls each registered beat every ``interval`` seconds until it
    answers ``False`` or its ``stop`` event is set."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._due: list[_Entry] = []
        self._order = itertools.count()
        self._live = 0
        self._thread: Optional[threading.Thread] = None

    def add(self, interval: float, beat: Callable[[], bool], stop: threading.Event) -> None:
        """Calls ``beat`` every ``interval`` seconds, first after one
        interval, while it returns ``True`` and ``stop`` is not set; call
        :meth:`stopped` once ``stop`` is set."""
        with self._cond:
            self._live += 1
            self._push(interval, beat, stop)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._loop, name="idem-heartbeats", daemon=True)
                self._thread.start()
            self._cond.notify()

    def stopped(self) -> None:
        """A run has ended: its entry is dropped at its next beat, or now,
        when ended runs outnumber live ones, so memory follows the live."""
        with self._cond:
            self._live -= 1
            if len(self._due) > 64 and len(self._due) > 2 * self._live:
                self._due = [entry for entry in self._due if not entry[4].is_set()]
                heapq.heapify(self._due)

    def _push(self, interval: float, beat: Callable[[], bool], stop: threading.Event) -> None:
        heapq.heappush(self._due, (time.monotonic() + interval, next(self._order), interval, beat, stop))

    def _loop(self) -> None:
        while True:
            with self._cond:
                while True:
                    now = time.monotonic()
                    if self._due and self._due[0][0] <= now:
                        _, _, interval, beat, stop = heapq.heappop(self._due)
                        break
                    self._cond.wait(self._due[0][0] - now if self._due else None)
            try:
                again = not stop.is_set() and beat()
            except Exception:  # noqa: BLE001 - one bad beat must not end all of them
                again = True
            if again and not stop.is_set():
                with self._cond:
                    self._push(interval, beat, stop)
