"""One claimed run: its lease kept alive by a background heartbeat, its
fence, its journaled steps, and the write that ends it."""

from __future__ import annotations

import contextvars
import json
import threading
import time
from typing import Any, Callable, Optional, TypeVar

from ._errors import ApiError, IdemError, LeaseLost, StepInDoubt, Terminal
from ._heartbeat import Heartbeats
from ._transport import Transport

T = TypeVar("T")

_current: contextvars.ContextVar[Optional["Run"]] = contextvars.ContextVar(
    "idem_current_run", default=None
)


def current_run() -> "Run":
    """The run of the idempotent call this code runs in (inside a function
    decorated with ``Idem.idempotent``): its ``fence``, ``attempt``,
    ``takeover`` and ``step``."""
    run = _current.get()
    if run is None:
        raise IdemError("current_run() is only available inside an idempotent call")
    return run


class Run:
    """A claim of ``scope``/``key``.

    When ``replayed`` is true, the key ran before: ``result`` is its stored
    result, and there is nothing to do. Otherwise the caller holds the key:
    do the work, pass ``fence`` to downstream writes, and end with
    ``complete(result)``, ``fail(...)`` or ``release()``. While the run is
    held, the client's heartbeat thread extends its lease every third of it;
    ``lease_lost`` is set if the lease is lost all the same: taken over, or
    run out with no extension confirmed (idem serve unreachable, the
    process stalled). ``check()`` reads the clock as well, so it is right
    even when the heartbeat thread has not run.
    """

    def __init__(
        self,
        transport: Transport,
        scope: str,
        key: str,
        answer: dict[str, Any],
        lease_ms: int,
        retention_ms: Optional[int],
        heartbeats: Heartbeats,
        claim_sent: float,
    ) -> None:
        self.scope = scope
        self.key = key
        self.lease_lost = threading.Event()
        self._transport = transport
        self._retention_ms = retention_ms
        self._finished = False
        self._stop = threading.Event()
        self._heartbeats: Optional[Heartbeats] = None
        self.replayed = answer["outcome"] == "completed"
        self.result: Any = answer.get("response")
        lease = answer.get("lease")
        self._lease: Optional[dict[str, Any]] = lease
        self.fence: Optional[int] = lease["fence"] if lease else None
        self.attempt: Optional[int] = lease["attempt"] if lease else None
        self.takeover: bool = bool(answer.get("takeover", False))
        # The lease as last confirmed runs out at this monotonic time,
        # measured from when the confirming request was sent.
        self._confirmed_until = claim_sent + lease_ms / 1000.0
        if lease is not None:
            self._lease_ms = lease_ms
            if time.monotonic() - claim_sent > lease_ms / 6000.0:
                # A claim that waited (or was retried) may have been granted
                # late in its call: confirm the lease before the work starts.
                self._heartbeat()
            self._heartbeats = heartbeats
            heartbeats.add(lease_ms / 3000.0, self._heartbeat, self._stop)

    def _heartbeat(self) -> bool:
        """One heartbeat: extends the lease; ``False`` once the run no
        longer needs them."""
        if self._stop.is_set():
            return False
        sent = time.monotonic()
        try:
            # One try, within a sixth of the lease: the beats of every run
            # share a thread, and the next beat comes soon enough.
            self._transport.call(
                "POST",
                "/v1/extend",
                {"lease": self._lease, "lease_ms": self._lease_ms},
                retries=0,
                timeout=max(0.2, self._lease_ms / 6000.0),
            )
            self._confirmed_until = sent + self._lease_ms / 1000.0
        except LeaseLost:
            if not self._stop.is_set():
                self.lease_lost.set()
            return False
        except IdemError:
            self._ran_out()
        return not self._stop.is_set()

    def _ran_out(self) -> bool:
        """Sets ``lease_lost`` once the lease as last confirmed has run
        out; whether it is set."""
        if not self.lease_lost.is_set() and time.monotonic() >= self._confirmed_until:
            self.lease_lost.set()
        return self.lease_lost.is_set()

    def _end(self) -> None:
        self._finished = True
        if not self._stop.is_set():
            self._stop.set()
            if self._heartbeats is not None:
                self._heartbeats.stopped()

    def _ending(self, write: Callable[[], Any]) -> None:
        # The heartbeat goes on while the write is tried (and tried again),
        # so the lease cannot lapse under a slow store.
        self._finished = True
        try:
            write()
        finally:
            self._end()

    def _held(self) -> dict[str, Any]:
        if self._lease is None:
            raise IdemError(f"{self.scope}/{self.key} was replayed: there is no claim to act on")
        if self._finished:
            raise IdemError(f"{self.scope}/{self.key}: the run has already ended")
        return self._lease

    def check(self) -> None:
        """Raises :class:`LeaseLost` if the lease was lost: call it before
        an irreversible step."""
        if self._lease is not None and self._ran_out():
            raise LeaseLost(f"{self.scope}/{self.key}: the lease was lost; stop")

    def complete(self, result: Any) -> None:
        """Stores ``result`` (anything ``json.dumps`` takes, without NaN
        or infinities); every later claim of the key gets it back.

        The work has run by now, so a result that cannot be stored (not
        JSON, or refused by idem serve as too large) is recorded as a
        terminal failure with the reason, replayed to later claims, and
        never run again; the error is raised."""
        lease = self._held()
        body: dict[str, Any] = {"lease": lease, "response": result}
        if self._retention_ms is not None:
            body["retention_ms"] = self._retention_ms
        try:
            json.dumps(result, allow_nan=False)
        except (TypeError, ValueError) as e:
            self._refused(f"the result cannot be stored as JSON: {e}")
            raise TypeError(f"{self.scope}/{self.key}: the result is not JSON: {e}") from e
        try:
            self._ending(lambda: self._transport.call("POST", "/v1/complete", body))
        except ApiError as e:
            if e.status in (400, 413):
                self._refused(f"idem serve refused the result: {e.detail}")
            raise

    def _refused(self, reason: str) -> None:
        # A definite refusal after the work ran ends the record failed, so
        # that no later claim runs the work again.
        body = {"lease": self._lease, "class": "terminal", "message": reason}
        self._finished = True
        try:
            self._transport.call("POST", "/v1/fail", body)
        except IdemError:
            pass
        finally:
            self._end()

    def fail(self, message: str, terminal: bool = False, unknown: bool = False) -> None:
        """Records a failure: by default retryable (the key is released and
        the next claim runs it again); ``terminal`` is stored and replayed;
        ``unknown`` parks the record for ``idem resolve``."""
        lease = self._held()
        failure_class = "unknown" if unknown else "terminal" if terminal else "retryable"
        body: dict[str, Any] = {"lease": lease, "class": failure_class, "message": message}
        if self._retention_ms is not None:
            body["retention_ms"] = self._retention_ms
        self._ending(lambda: self._transport.call("POST", "/v1/fail", body))

    def release(self) -> None:
        """Gives the claim back without an outcome: the next claim runs the
        work."""
        lease = self._held()
        self._ending(lambda: self._transport.call("POST", "/v1/release", {"lease": lease}))

    def step(self, name: str, fn: Callable[[str], T], policy: str = "retry") -> T:
        """A journaled step: runs ``fn(downstream_key)`` once across every
        attempt of the run, and returns its result (JSON-encodable), from
        the journal when an earlier attempt finished it.

        Pass ``downstream_key`` to an external API that deduplicates on a
        key (a payment provider's Idempotency-Key). If an earlier attempt
        started the step and never finished, its effect is in doubt:
        ``policy="retry"`` runs it again with the same downstream key;
        ``policy="park"`` fails the run as ``unknown`` and raises
        :class:`StepInDoubt`.
        """
        if policy not in ("retry", "park"):
            raise ValueError(f"step policy {policy!r}: use 'retry' or 'park'")
        lease = self._held()
        self.check()
        begun = self._transport.call("POST", "/v1/steps/begin", {"lease": lease, "step": name})
        state = begun["state"]
        if state == "done":
            return begun["result"]
        if state == "skipped":
            return None  # type: ignore[return-value]
        if state == "in_doubt" and policy == "park":
            self.fail(
                f"step {name!r} in doubt: started by attempt {begun['attempt']}, never finished",
                unknown=True,
            )
            raise StepInDoubt(name, begun["attempt"])
        value = fn(begun["downstream_key"])
        self._transport.call(
            "POST", "/v1/steps/finish", {"lease": lease, "step": name, "result": value}
        )
        return value

    def _exit(self, error: Optional[BaseException]) -> None:
        if self._lease is None or self._finished:
            return
        if error is None:
            self.release()
            raise IdemError(
                f"{self.scope}/{self.key}: the block ended without run.complete(result); "
                "the claim was released"
            )
        try:
            if isinstance(error, LeaseLost):
                self._end()
            elif isinstance(error, Terminal):
                self.fail(str(error) or type(error).__name__, terminal=True)
            else:
                self.fail(f"{type(error).__name__}: {error}")
        except IdemError:
            # The handler's own error says more; an unrecorded failure
            # only leaves the claim to run out, as a crash would.
            self._end()
